"""The least a Python KServe v2 server can do: ``identity_fp32`` answered in the front end.

One process serves HTTP (uvicorn + httptools on uvloop, a bare ASGI callable, the stack
Sluice's gateway uses) and gRPC (``grpc.aio`` with the ``service_pb2`` classes shipped in
``tritonclient``, the stack Sluice's gRPC front end uses) on one event loop, as the
gateway does. Inference echoes ``INPUT0`` (FP32 [-1, 16]) back as ``OUTPUT0``: no
validation, no Redis, no worker. ``bench_grpc_floor.py`` drives it with perf_analyzer
to measure what each protocol's library costs per request before any serving logic.

Usage:
    python benchmarks/floor_server.py --http-port 28100 --grpc-port 28101
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import uvicorn
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

MODEL = "identity_fp32"
TENSOR = {"datatype": "FP32", "shape": [-1, 16]}
METADATA = json.dumps(
    {
        "name": MODEL,
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "INPUT0", **TENSOR}],
        "outputs": [{"name": "OUTPUT0", **TENSOR}],
    }
).encode()
CONFIG = json.dumps(
    {
        "name": MODEL,
        "max_batch_size": 64,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
    }
).encode()
SERVER = json.dumps({"name": "floor", "version": "0", "extensions": ["binary_tensor_data"]})

#: inferences answered over both protocols (``GET /floor/count``)
served = [0]


async def http_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Raw ASGI: health, metadata, config, and binary-tensor infer (one input, 64 bytes)."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path: str = scope["path"]
    headers: list[tuple[bytes, bytes]] = []
    if path.endswith("/infer"):
        served[0] += 1
        length = int(dict(scope["headers"]).get(b"inference-header-content-length", b"0"))
        raw = body[length:]
        rows = len(raw) // 64
        head = json.dumps(
            {
                "model_name": MODEL,
                "model_version": "1",
                "outputs": [
                    {
                        "name": "OUTPUT0",
                        "datatype": "FP32",
                        "shape": [rows, 16],
                        "parameters": {"binary_data_size": len(raw)},
                    }
                ],
            }
        ).encode()
        out = head + raw
        headers = [
            (b"inference-header-content-length", str(len(head)).encode()),
            (b"content-type", b"application/octet-stream"),
        ]
    elif path == "/floor/count":
        out = json.dumps({"count": served[0]}).encode()
    elif path.endswith("/config"):
        out = CONFIG
    elif path.startswith("/v2/models/"):
        out = METADATA
    else:
        out = SERVER.encode()
    headers.append((b"content-length", str(len(out)).encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


class FloorServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The RPCs perf_analyzer calls; ``ModelInfer`` echoes the raw input."""

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(name="floor", version="0")

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        response = service_pb2.ModelMetadataResponse(
            name=MODEL, versions=["1"], platform="onnxruntime_onnx"
        )
        response.inputs.add(name="INPUT0", datatype="FP32", shape=[-1, 16])
        response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[-1, 16])
        return response

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        config = model_config_pb2.ModelConfig(name=MODEL, max_batch_size=64)
        for target, name in ((config.input, "INPUT0"), (config.output, "OUTPUT0")):
            tensor = target.add(name=name, data_type=model_config_pb2.TYPE_FP32)
            tensor.dims.append(16)
        return service_pb2.ModelConfigResponse(config=config)

    def _echo(self, request: Any) -> Any:
        served[0] += 1
        raw = request.raw_input_contents[0]
        response = service_pb2.ModelInferResponse(
            model_name=MODEL, model_version="1", id=request.id
        )
        response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[len(raw) // 64, 16])
        response.raw_output_contents.append(raw)
        return response

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        return self._echo(request)

    async def ModelStreamInfer(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        async for request in requests:
            yield service_pb2.ModelStreamInferResponse(infer_response=self._echo(request))


async def serve(http_port: int, grpc_port: int) -> None:
    """Both front ends on one loop until cancelled."""
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FloorServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await server.start()
    config = uvicorn.Config(
        http_app, host="127.0.0.1", port=http_port, http="httptools", log_level="warning",
        access_log=False, lifespan="off",
    )  # fmt: skip
    try:
        await uvicorn.Server(config).serve()
    finally:
        await server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, default=28100)
    parser.add_argument("--grpc-port", type=int, default=28101)
    args = parser.parse_args()
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):  # SIGINT from the benchmark: a normal stop
        uvloop.run(serve(args.http_port, args.grpc_port))


if __name__ == "__main__":
    main()
