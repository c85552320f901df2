"""HTTP endpoint access control (Triton ``--http-restricted-api``), as ASGI middleware.

Runs before routing, so a refused request does nothing; see :mod:`api.access`.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from sluice.api.access import AccessPolicy, http_group
from sluice.api.http.responses import error_response


class RestrictedApiMiddleware:
    """Refuse calls to restricted API groups without the right header (403).

    Args:
        app: the wrapped application.
        policy: the groups and the header each asks for (header prefix ``""``).
    """

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            group = http_group(scope["method"], scope["path"])
            if group is not None:
                headers = {
                    k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
                }
                header = self.policy.missing_header(group, headers)
                if header is not None:
                    response = error_response(
                        f"This API is restricted, expecting header '{header}'", 403
                    )
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)
