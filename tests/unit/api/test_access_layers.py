"""How :func:`api.app.wrap_asgi` stacks access control and the infer fast path: while the
``inference`` group is open, what uvicorn serves is the :class:`InferEndpoint` itself (the
only app the task-free path of ``api/http/protocol.py`` takes), and the restricted groups
behind it still answer 403 without their header; a restricted ``inference`` group puts
access control first."""

from __future__ import annotations

from types import SimpleNamespace

from starlette.testclient import TestClient

from sluice.api.app import RestrictedApiMiddleware, create_app, wrap_asgi
from sluice.api.http.infer import InferEndpoint
from sluice.api.settings import GatewaySettings

ADMIN = "model-repository,logging,trace:admin-key=0123abcd"
REFUSED = {"error": "This API is restricted, expecting header 'admin-key'"}


def _served(*specs: str) -> object:
    settings = GatewaySettings.model_validate({"http": {"restricted_apis": list(specs)}})
    # InferEndpoint reads these four members; no request here reaches the data plane
    dataplane = SimpleNamespace(
        submission=None, shared_memory=None, tracing=None, settings=settings
    )
    app = create_app(settings, dataplane)  # type: ignore[arg-type]
    return wrap_asgi(settings, dataplane, app)  # type: ignore[arg-type]


def test_open_inference_keeps_the_fast_path_in_front() -> None:
    served = _served(ADMIN)
    assert isinstance(served, InferEndpoint)
    assert isinstance(served.app, RestrictedApiMiddleware)
    client = TestClient(served)  # type: ignore[arg-type]
    for method, path in (
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/repository/models/add_sub/unload"),
        ("GET", "/v2/logging"),
        ("POST", "/v2/trace/setting"),
    ):
        answer = client.request(method, path, headers={"admin-key": "wrong"})
        assert (answer.status_code, answer.json()) == (403, REFUSED), path


def test_restricted_inference_is_checked_before_the_fast_path() -> None:
    served = _served(ADMIN, "inference:infer-key=let-me-in")
    assert isinstance(served, RestrictedApiMiddleware)
    answer = TestClient(served).post("/v2/models/add_sub/infer", content=b"{}")  # type: ignore[arg-type]
    assert answer.status_code == 403
    assert answer.json() == {"error": "This API is restricted, expecting header 'infer-key'"}


def test_no_restriction_serves_the_fast_path_alone() -> None:
    served = _served()
    assert isinstance(served, InferEndpoint)
    assert not isinstance(served.app, RestrictedApiMiddleware)
