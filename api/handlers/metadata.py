"""Server metadata, model metadata and model configuration, and the extensions served.

Shapes: docs/reference/http-protocol.md (Server and model metadata, Model
configuration JSON, Trace and shared memory); Triton ``src/http_server.cc``
(``HandleServerMetadata``, ``HandleModelMetadata``, ``HandleModelConfig``).

Only what is implemented is advertised in the server metadata's ``extensions``. System
shared memory is (``system_shared_memory``); CUDA shared memory
(``cuda_shared_memory``, :mod:`api.cuda_shared_memory`) is advertised only where the
gateway sees a CUDA device through NVIDIA's bindings. Elsewhere its endpoints answer as a
Triton built without GPU support answers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.api.cuda_shared_memory import cuda_runtime
from sluice.api.models import ModelRegistry, ModelView
from sluice.api.settings import GatewaySettings

__all__ = ["EXTENSIONS", "Metadata"]

#: extensions this server implements, in Triton's order.
EXTENSIONS = (
    "classification",
    "sequence",  # the sequence batcher and the sequence_id/start/end parameters
    "model_repository",
    "model_repository(unload_dependents)",  # ensembles unload with their steps
    "schedule_policy",  # the request parameters priority and timeout
    "model_configuration",
    "system_shared_memory",  # client regions of the gateway's host (api.shared_memory)
    "binary_tensor_data",
    "parameters",
    "statistics",
    "logging",
    "trace",  # api.trace_settings, api.request_trace
)


class Metadata:
    """What the server and its models are.

    Args:
        settings: the gateway settings (``server_id``).
        registry: cached model views.
    """

    def __init__(self, settings: GatewaySettings, registry: ModelRegistry) -> None:
        self._settings = settings
        self._registry = registry

    def server_metadata(self) -> dict[str, Any]:
        """``GET /v2`` body: ``{"name", "version", "extensions"}``."""
        from sluice import __version__

        extensions = list(EXTENSIONS)
        if cuda_runtime() is not None:  # after system_shared_memory, in Triton's order
            extensions.insert(extensions.index("system_shared_memory") + 1, "cuda_shared_memory")
        return {"name": self._settings.server_id, "version": __version__, "extensions": extensions}

    async def model_metadata(self, model: str, version: int | None) -> dict[str, Any]:
        """``GET /v2/models/{m}[/versions/{v}]`` body: name, READY versions (the one asked
        for, when a version is), platform, inputs and outputs (``[-1] + dims`` when the
        model batches).

        Raises:
            SluiceError: NOT_FOUND / UNAVAILABLE from model resolution.
        """
        view, resolved = await self._registry.resolve(model, version)
        versions = (
            [str(resolved)] if version is not None else [str(v) for v in view.ready_versions()]
        )

        def shape(dims: Sequence[int]) -> list[int]:
            return [-1, *dims] if view.max_batch_size > 0 else list(dims)

        return {
            "name": view.name,
            "versions": versions,
            "platform": view.platform,
            "inputs": [
                {"name": s.name, "datatype": s.datatype, "shape": shape(s.dims)}
                for s in view.inputs.values()
            ],
            "outputs": [
                {"name": s.name, "datatype": s.datatype, "shape": shape(s.dims)}
                for s in view.outputs.values()
            ],
        }

    async def model_config(self, model: str, version: int | None) -> ModelView:
        """The view whose ``config`` (gRPC) / ``config_json`` (HTTP) a config call returns.

        Raises:
            SluiceError: NOT_FOUND / UNAVAILABLE from model resolution.
        """
        view, _ = await self._registry.resolve(model, version)
        return view
