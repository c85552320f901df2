"""tritonserver flags that ``sluice serve`` accepts and that have no effect in Sluice.

A launch command written for tritonserver 2.51 must start Sluice, not stop it with
``unrecognized arguments``. Every tritonserver flag Sluice does not implement is declared
here with the reason it has no effect; ``sluice serve`` logs one warning line for each one
given (:func:`warn_inert_flags`). Flag names and value forms are tritonserver's
(``--help`` of 2.51, server ``src/command_line_parser.cc``); docs/reference/compatibility.md
lists them.
"""

from __future__ import annotations

import argparse
import logging

__all__ = ["INERT_FLAGS", "add_inert_arguments", "warn_inert_flags"]

#: flag -> why it has no effect in Sluice.
INERT_FLAGS: dict[str, str] = {
    "--id": "the server metadata's name is always 'triton'",
    "--model-load-thread-count": "models load in their own instance processes, all at once",
    "--model-load-retry-count": "a failed load is not retried; load it again with the API",
    "--model-namespacing": "model names are unique across repositories",
    "--enable-peer-access": "no CUDA peer access is set up",
    "--allow-http": "the HTTP front end is always served",
    "--reuse-http-port": "gateway processes always share the HTTP port (SO_REUSEPORT)",
    "--http-header-forward-pattern": "HTTP headers are not forwarded as request parameters",
    "--http-thread-count": "the HTTP front end is one event loop per gateway process "
    "(--gateway-processes sets how many)",
    "--reuse-grpc-port": "gateway processes always share the gRPC port (SO_REUSEPORT)",
    "--grpc-header-forward-pattern": "gRPC metadata is not forwarded as request parameters",
    "--grpc-max-connection-age": "gRPC connections have no maximum age",
    "--grpc-max-connection-age-grace": "gRPC connections have no maximum age",
    "--allow-sagemaker": "there is no SageMaker front end",
    "--sagemaker-port": "there is no SageMaker front end",
    "--sagemaker-safe-port-range": "there is no SageMaker front end",
    "--sagemaker-thread-count": "there is no SageMaker front end",
    "--allow-vertex-ai": "there is no Vertex AI front end",
    "--vertex-ai-port": "there is no Vertex AI front end",
    "--vertex-ai-thread-count": "there is no Vertex AI front end",
    "--vertex-ai-default-model": "there is no Vertex AI front end",
    "--backend-directory": "backends are built into Sluice",
    "--backend-config": "backend settings come from each model's config.pbtxt parameters",
    "--repoagent-directory": "there are no repository agents",
    "--cache-directory": "the response cache is built into Sluice (--cache-config)",
    "--rate-limit": "there is no rate limiter; instances take work from their model's queue",
    "--rate-limit-resource": "there is no rate limiter",
    "--pinned-memory-pool-byte-size": "there is no pinned-memory pool",
    "--cuda-memory-pool-byte-size": "there is no CUDA memory pool; backends allocate",
    "--cuda-virtual-address-size": "implicit state is kept in Redis, not in growable memory",
    "--min-supported-compute-capability": "every GPU the backend can use is used",
    "--buffer-manager-thread-count": "tensor copies run in the instance processes",
    "--host-policy": "there are no host policies",
    "--model-load-gpu-limit": "loads are not refused by GPU memory use",
    "--response-cache-byte-size": "the response cache is set with --cache-config local,size=N",
    # flags of tritonserver releases after 2.51
    "--http-max-input-size": "the request body limit is SLUICE_HTTP__MAX_BODY_BYTES",
    "--grpc-max-response-pool-size": "gRPC responses are not pooled",
}

logger = logging.getLogger("sluice")


def add_inert_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every :data:`INERT_FLAGS` flag on ``parser``: each takes one value
    (``--flag=value`` or ``--flag value``) and may be repeated, as in tritonserver."""
    group = parser.add_argument_group(
        "tritonserver flags without effect",
        "accepted so that a tritonserver launch command starts Sluice; each given one is "
        "logged once with the reason",
    )
    for flag, reason in INERT_FLAGS.items():
        group.add_argument(
            flag, dest=_dest(flag), action="append", default=None, metavar="VALUE", help=reason
        )


def warn_inert_flags(args: argparse.Namespace) -> list[str]:
    """Log one warning per inert flag given (each value of a repeated one); returns the
    lines logged."""
    lines = []
    for flag, reason in INERT_FLAGS.items():
        for value in getattr(args, _dest(flag), None) or ():
            lines.append(f"{flag}={value} has no effect in Sluice: {reason}")
            logger.warning("%s", lines[-1])
    return lines


def _dest(flag: str) -> str:
    return "inert_" + flag.lstrip("-").replace("-", "_")
