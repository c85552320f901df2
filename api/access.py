"""Endpoint access control: Triton's ``--http-restricted-api`` / ``--grpc-restricted-protocol``.

Each flag value is ``<api-group>[,<api-group>…]:<header>=<value>``; a request to a
restricted group must carry that header (HTTP) or metadata key (gRPC) with exactly
that value, or it is refused before anything runs. Groups are Triton's
(server ``src/restricted_features.h``): ``health``, ``metadata``, ``inference``,
``shared-memory``, ``model-config``, ``model-repository``, ``statistics``, ``trace``,
``logging``. Over gRPC the metadata key is ``triton-grpc-protocol-<header>``
(Triton ``kRestrictedProtocolHeaderTemplate``; gRPC metadata keys are lower case).

Refusals: HTTP 403 ``{"error": "This API is restricted, expecting header '<header>'"}``;
gRPC PERMISSION_DENIED ``This protocol is restricted, expecting header
'triton-grpc-protocol-<header>'`` (Triton itself answers UNAVAILABLE here; Sluice
answers the code gRPC defines for a caller without permission;
docs/reference/compatibility.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "GROUPS",
    "GRPC_HEADER_PREFIX",
    "AccessPolicy",
    "Restriction",
    "http_group",
]

GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)

GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


@dataclass(frozen=True, slots=True)
class Restriction:
    """The header and value a restricted group asks for (header in lower case)."""

    header: str
    value: str


class AccessPolicy:
    """Which API groups need which header; empty = everything open.

    Args:
        specs: flag values, ``<api-group>[,<api-group>…]:<header>=<value>`` each.
        header_prefix: prefix of the header/metadata key (``""`` for HTTP,
            :data:`GRPC_HEADER_PREFIX` for gRPC).

    Raises:
        ValueError: a malformed spec, an unknown group, or a group restricted twice
            (Triton rejects both at start-up).
    """

    def __init__(self, specs: Iterable[str], header_prefix: str = "") -> None:
        self._rules: dict[str, Restriction] = {}
        for spec in specs:
            groups, header, value = parse_spec(spec)
            for group in groups:
                if group in self._rules:
                    raise ValueError(f"restricted api group '{group}' is given more than once")
                self._rules[group] = Restriction((header_prefix + header).lower(), value)

    def __bool__(self) -> bool:
        return bool(self._rules)

    def restricts(self, group: str) -> bool:
        """Whether calls to ``group`` need a header."""
        return group in self._rules

    def missing_header(self, group: str, headers: Mapping[str, str]) -> str | None:
        """The header a call to ``group`` lacks (or has a wrong value for); None = may run.

        Args:
            group: the API group of the call.
            headers: the call's headers / metadata, keys in lower case.
        """
        rule = self._rules.get(group)
        if rule is None or headers.get(rule.header) == rule.value:
            return None
        return rule.header


def parse_spec(spec: str) -> tuple[list[str], str, str]:
    """Split ``<group>[,<group>…]:<header>=<value>``.

    Raises:
        ValueError: naming the spec and what is wrong with it.
    """
    groups_text, sep, rest = spec.partition(":")
    header, eq, value = rest.partition("=")
    if not sep or not eq or not header.strip() or not groups_text.strip():
        raise ValueError(
            f"invalid restricted api spec '{spec}': expected "
            "'<api-group>[,<api-group>...]:<header>=<value>'"
        )
    groups = [g.strip() for g in groups_text.split(",")]
    for group in groups:
        if group not in GROUPS:
            raise ValueError(
                f"unknown restricted api group '{group}' in '{spec}'; known groups: "
                + ", ".join(GROUPS)
            )
    return groups, header.strip(), value


def http_group(method: str, path: str) -> str | None:
    """The API group of an HTTP request (Triton ``http_server.cc`` handlers), None = none.

    Args:
        method: HTTP method (unused by the mapping, kept for clarity of call sites).
        path: URL path, e.g. ``/v2/models/m/versions/1/infer``.
    """
    del method
    parts: Sequence[str] = [p for p in path.split("/") if p]
    if not parts or parts[0] != "v2":
        return None
    if len(parts) == 1:
        return "metadata"
    head = parts[1]
    if head == "health":
        return "health"
    if head == "repository":
        return "model-repository"
    if head in ("systemsharedmemory", "cudasharedmemory"):
        return "shared-memory"
    if head == "logging":
        return "logging"
    if head == "trace":
        return "trace"
    if head == "jobs":
        return "inference"
    if head == "models":
        last = parts[-1]
        if len(parts) == 3 and last == "stats":
            return "statistics"
        if last in ("infer", "generate", "generate_stream", "jobs"):
            return "inference"
        if last == "ready":
            return "health"
        if last == "config":
            return "model-config"
        if last == "stats":
            return "statistics"
        if last == "trace" or (len(parts) >= 2 and parts[-2] == "trace"):
            return "trace"
        return "metadata"
    return None
