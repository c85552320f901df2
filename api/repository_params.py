"""Parameters of Triton's model repository load/unload requests, for HTTP and gRPC alike.

Triton ``POST /v2/repository/models/{m}/load`` (docs/reference/http-protocol.md, Repository
extension): ``config`` is a
``ModelConfig`` JSON string; ``file:<version>/<path>`` carries a file of a
complete model directory (base64 in HTTP JSON, raw ``bytes_param`` in gRPC) and
needs ``config``. Unload takes ``unload_dependents`` (bool).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping

from sluice.broker.errors import invalid_arg


def load_parameters(
    model: str, items: Iterable[tuple[str, object]], *, files_base64: bool
) -> tuple[str, dict[str, bytes]]:
    """``(config_json, files)`` of a load request.

    Args:
        model: model name (for messages).
        items: the request's parameters as ``(key, value)``.
        files_base64: HTTP: ``file:`` values are base64 strings; gRPC: raw bytes.

    Raises:
        SluiceError: INVALID_ARG for a value of the wrong type, bad base64, a ``file:``
            parameter without ``config``, or an unknown key.
    """
    config_json = ""
    files: dict[str, bytes] = {}
    for key, value in items:
        if key == "config":
            if not isinstance(value, str):
                raise invalid_arg(
                    f"load of model '{model}': parameter 'config' must be a "
                    "string holding the model configuration as JSON",
                    model=model,
                )
            config_json = value
        elif key.startswith("file:"):
            path = key.removeprefix("file:")
            if files_base64:
                if not isinstance(value, str):
                    raise invalid_arg(
                        f"load of model '{model}': parameter '{key}' must be a base64 string",
                        model=model,
                    )
                try:
                    files[path] = base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError):
                    raise invalid_arg(
                        f"load of model '{model}': parameter '{key}' is not valid base64",
                        model=model,
                    ) from None
            else:
                if not isinstance(value, bytes):
                    raise invalid_arg(
                        f"load of model '{model}': parameter '{key}' must be bytes_param",
                        model=model,
                    )
                files[path] = value
        else:
            raise invalid_arg(
                f"load of model '{model}': unexpected parameter '{key}' (expected "
                "'config' or 'file:<version>/<path>')",
                model=model,
            )
    if files and not config_json:
        raise invalid_arg(
            f"load of model '{model}': 'file:' parameters need the 'config' parameter", model=model
        )
    return config_json, files


def unload_dependents(model: str, parameters: Mapping[str, object]) -> bool:
    """The ``unload_dependents`` flag of an unload request (default false).

    Raises:
        SluiceError: INVALID_ARG when it is not a boolean.
    """
    value = parameters.get("unload_dependents", False)
    if not isinstance(value, bool):
        raise invalid_arg(
            f"unload of model '{model}': 'unload_dependents' must be a boolean", model=model
        )
    return value
