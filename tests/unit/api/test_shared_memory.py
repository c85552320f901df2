"""Unit tests for api.shared_memory (regions over real POSIX shared-memory objects under
/dev/shm) and api.shm_tensors (the tensor parameters, as tritonclient sends them)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc._utils import _get_inference_request as grpc_request
from tritonclient.http._utils import _get_inference_request as http_request

from sluice.api.cuda_shared_memory import cuda_runtime
from sluice.api.grpc.codec import encode_infer_response as grpc_encode
from sluice.api.grpc.codec import parse_infer_request as grpc_parse
from sluice.api.http.infer_request import parse_infer_request as http_parse
from sluice.api.http.infer_response import encode_infer_response as http_encode
from sluice.api.shared_memory import SHM_ROOT, SharedMemoryRegistry
from sluice.api.shm_tensors import ShmRef, read_inputs, resolve_outputs, write_output
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.messages import WireTensor

BYTE_SIZE = "shared_memory_byte_size"

pytestmark = pytest.mark.skipif(not SHM_ROOT.is_dir(), reason="no /dev/shm")


@pytest.fixture
def key() -> Iterator[str]:
    """A 10000-byte shared-memory object holding bytes 0, 1, ... 255, 0, 1, ..."""
    name = f"sluice_unit_{uuid.uuid4().hex[:12]}"
    path = SHM_ROOT / name
    path.write_bytes(bytes(i % 256 for i in range(10000)))
    yield "/" + name
    path.unlink(missing_ok=True)


def _error(call: object, *args: object) -> SluiceError:
    with pytest.raises(SluiceError) as info:
        call(*args)  # type: ignore[operator]
    return info.value


def test_register_status_unregister(key: str) -> None:
    registry = SharedMemoryRegistry()
    registry.register_system("b", key.lstrip("/"), 0, 10000)  # shm_open's key without "/"
    registry.register_system("a", key, 4097, 100)  # status lists regions by name
    assert registry.system_status() == [
        {"name": "a", "key": key, "offset": 4097, "byte_size": 100},
        {"name": "b", "key": key.lstrip("/"), "offset": 0, "byte_size": 10000},
    ]
    assert registry.system_status("a") == [registry.system_status()[0]]
    # a tensor's offset counts from the region's start, not the object's
    assert registry.slice("a", 3, 4).read() == bytes([4, 5, 6, 7])
    registry.unregister_system("a")
    registry.unregister_system("a")  # not registered: nothing to do
    assert [r["name"] for r in registry.system_status()] == ["b"]
    registry.unregister_system()
    assert registry.system_status() == []
    error = _error(registry.system_status, "b")
    assert (error.code, error.message) == (
        ErrorCode.NOT_FOUND,
        "Unable to find system shared memory region: 'b'",
    )


def test_register_refusals(key: str) -> None:
    registry = SharedMemoryRegistry()
    opened = "Unable to open shared memory region"
    cases = [
        (("", key, 0, 8), ErrorCode.INVALID_ARG,
         "'region name' is necessary to register system shared memory region"),
        (("r", key, 9000, 1001), ErrorCode.INVALID_ARG,
         "failed to register shared memory region 'r': invalid args"),
        (("r", "/nope_" + key[1:], 0, 8), ErrorCode.INTERNAL, f"{opened}: '/nope_{key[1:]}'"),
        (("r", "//", 0, 8), ErrorCode.INVALID_ARG,
         "cannot register shared memory region 'r' - invalid shm key '//'"),
        (("r", "/../etc/passwd", 0, 8), ErrorCode.INTERNAL, f"{opened}: '/../etc/passwd'"),
        (("r", "..", 0, 8), ErrorCode.INTERNAL, f"{opened}: '..'"),
        (("r", "/ev\x00x", 0, 8), ErrorCode.INTERNAL, f"{opened}: '/ev\x00x'"),
        (("r", key, 16, 0), ErrorCode.INVALID_ARG,
         "failed to register shared memory region 'r': byte_size must be greater than 0 "
         "(a zero-length region cannot be mapped)"),
        (
            ("r", "/triton_python_backend_shm_region_7", 0, 8),
            ErrorCode.INVALID_ARG,
            "cannot register shared memory region 'r' with key "
            "'/triton_python_backend_shm_region_7' as the key contains the reserved prefix "
            "'triton_python_backend_shm_region_'",
        ),
    ]  # fmt: skip
    for args, code, message in cases:
        error = _error(registry.register_system, *args)
        assert (error.code, error.message) == (code, message), args
    registry.register_system("r", key, 0, 8)
    error = _error(registry.register_system, "r", key, 0, 8)
    assert (error.code, error.message) == (
        ErrorCode.ALREADY_EXISTS,
        "shared memory region 'r' already in manager",
    )


def test_symlink_key_refused(key: str, tmp_path: Path) -> None:
    """A key that is a symbolic link in /dev/shm is not followed out of it."""
    target = tmp_path / "secret"
    target.write_bytes(b"x" * 64)
    link = SHM_ROOT / f"{key[1:]}_link"
    os.symlink(target, link)
    try:
        error = _error(SharedMemoryRegistry().register_system, "r", f"{key}_link", 0, 8)
        assert error.code is ErrorCode.INTERNAL
    finally:
        link.unlink()


def test_slice_bounds(key: str) -> None:
    registry = SharedMemoryRegistry()
    registry.register_system("r", key, 100, 64)
    assert len(registry.slice("r", 0, 64).read()) == 64
    assert len(registry.slice("r", 63, 1).read()) == 1
    for offset, size, message in [
        (64, 0, "Invalid offset for shared memory region: 'r'"),
        (-1, 4, "Invalid offset for shared memory region: 'r'"),
        (60, 5, "Invalid offset + byte size for shared memory region: 'r'"),
        (0, -1, "Invalid offset + byte size for shared memory region: 'r'"),
    ]:
        error = _error(registry.slice, "r", offset, size)
        assert (error.code, error.message) == (ErrorCode.INVALID_ARG, message)
    error = _error(registry.slice, "x", 0, 1)
    assert (error.code, error.message) == (
        ErrorCode.NOT_FOUND,
        "Unable to find shared memory region: 'x'",
    )


def test_outputs_written_and_region_kept_while_in_flight(key: str) -> None:
    registry = SharedMemoryRegistry()
    registry.register_system("out", key, 5000, 16)
    (target,) = resolve_outputs(registry, {"Y": ShmRef("out", 4, 8)}).values()
    registry.unregister_system("out")  # the request in flight still holds its slice
    write_output(target, WireTensor("Y", "UINT8", (8,), b"ABCDEFGH"))
    raw = (SHM_ROOT / key[1:]).read_bytes()
    assert raw[5004:5012] == b"ABCDEFGH"
    assert raw[5000:5004] == bytes(i % 256 for i in range(5000, 5004))
    error = _error(write_output, target, WireTensor("Y", "UINT8", (9,), b"123456789"))
    assert (error.code, error.message) == (
        ErrorCode.INTERNAL,
        "shared memory size specified with the request for output 'Y' (8 bytes) should be at "
        "least 9 bytes to hold the results",
    )


def test_shrunk_object_refused_not_read_past_its_end(key: str) -> None:
    """An object truncated after register: reads and writes of the window fail with an
    error naming the region (a mapping would raise SIGBUS in the gateway)."""
    registry = SharedMemoryRegistry()
    registry.register_system("in", key, 4096, 64)
    registry.register_system("out", key, 8192, 64)
    target = registry.slice("out", 0, 8)
    os.truncate(SHM_ROOT / key[1:], 4096 + 10)
    error = _error(registry.slice("in", 0, 64).read)
    assert (error.code, error.message) == (
        ErrorCode.INVALID_ARG,
        f"shared memory region 'in' is smaller than registered: its object '{key}' now "
        "holds 4106 bytes, the region needs 4160",
    )
    assert registry.slice("in", 2, 8).read() == bytes(range(2, 10))  # bytes still there
    error = _error(target.write, b"ABCDEFGH")
    assert (error.code, error.message) == (
        ErrorCode.INVALID_ARG,
        f"shared memory region 'out' is smaller than registered: its object '{key}' now "
        "holds 4106 bytes, the region needs 8256",
    )
    assert (SHM_ROOT / key[1:]).stat().st_size == 4106  # nothing written, not extended
    os.truncate(SHM_ROOT / key[1:], 0)
    assert _error(registry.slice("in", 0, 1).read).code is ErrorCode.INVALID_ARG


def test_region_keeps_object_open_until_dropped(key: str) -> None:
    """An unlinked object stays readable through its region; the descriptor is closed
    once no one holds the region."""
    target = str(SHM_ROOT / key[1:])

    def open_on_object() -> int:
        """This process's descriptors open on the object (other threads' come and go)."""
        count = 0
        for fd in Path("/proc/self/fd").iterdir():
            with contextlib.suppress(OSError):  # closed since it was listed
                count += os.readlink(fd).startswith(target)
        return count

    registry = SharedMemoryRegistry()
    registry.register_system("r", key, 10, 4)
    (SHM_ROOT / key[1:]).unlink()
    assert registry.slice("r", 0, 4).read() == bytes([10, 11, 12, 13])
    assert open_on_object() == 1
    registry.unregister_system("r")
    assert open_on_object() == 0


def _tensors(module: object) -> tuple[list[object], list[object]]:
    a = module.InferInput("A", [1, 4], "FP32")  # type: ignore[attr-defined]
    a.set_shared_memory("in", 16, offset=32)
    b = module.InferInput("B", [1, 4], "FP32")  # type: ignore[attr-defined]
    b.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    y = module.InferRequestedOutput("Y")  # type: ignore[attr-defined]
    y.set_shared_memory("out", 16)
    z = module.InferRequestedOutput("Z")  # type: ignore[attr-defined]
    return [a, b], [y, z]


def _common() -> dict[str, object]:
    return {
        "request_id": "",
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
        "priority": 0,
        "timeout": None,
    }


def test_http_request_and_response(key: str) -> None:
    """tritonclient.http's request: A read from the region, Y written into it with no data
    in the response, B and Z as usual."""
    inputs, outputs = _tensors(httpclient)
    body, length = http_request(inputs=inputs, outputs=outputs, custom_parameters=None, **_common())
    parsed = http_parse(body, length, model="m")
    assert parsed.shm is not None
    assert (parsed.shm.inputs, parsed.shm.outputs) == (
        {"A": ShmRef("in", 32, 16)},
        {"Y": ShmRef("out", 0, 16)},
    )
    registry = SharedMemoryRegistry()
    registry.register_system("in", key, 0, 64)
    registry.register_system("out", key, 8192, 64)
    a, b = read_inputs(registry, parsed.inputs, parsed.shm.inputs)
    assert a.data == bytes(range(32, 48))
    assert b.data == np.ones(4, dtype=np.float32).tobytes()
    targets = resolve_outputs(registry, parsed.shm.outputs)
    y = WireTensor("Y", "FP32", (1, 4), np.full(4, 2.5, dtype=np.float32).tobytes())
    z = WireTensor("Z", "FP32", (1, 4), np.full(4, 7.0, dtype=np.float32).tobytes())
    content, headers = http_encode(
        model="m", version="1", client_id="", outputs=[y, z], requested=parsed.outputs,
        binary_data_output=False, shm_outputs=targets,
    )  # fmt: skip
    header = content[: int(headers["Inference-Header-Content-Length"])]
    assert b'{"name":"Y","datatype":"FP32","shape":[1,4]}' in header
    assert content.endswith(z.data)
    assert (SHM_ROOT / key[1:]).read_bytes()[8192 : 8192 + 16] == y.data


def test_grpc_request_and_response(key: str) -> None:
    inputs, outputs = _tensors(grpcclient)
    request = grpc_request(
        model_name="m",
        inputs=inputs,
        model_version="",
        outputs=outputs,
        parameters=None,
        **_common(),
    )
    parsed = grpc_parse(request)
    assert parsed.shm is not None
    assert parsed.shm.inputs == {"A": ShmRef("in", 32, 16)}
    assert parsed.shm.outputs == {"Y": ShmRef("out", 0, 16)}
    registry = SharedMemoryRegistry()
    registry.register_system("out", key, 8192, 64)
    y = WireTensor("Y", "FP32", (1, 4), np.full(4, -1.0, dtype=np.float32).tobytes())
    z = WireTensor("Z", "FP32", (1, 4), np.full(4, 3.0, dtype=np.float32).tobytes())
    response = grpc_encode(
        model="m", version="1", client_id="", outputs=[y, z], requested=parsed.outputs,
        shm_outputs=resolve_outputs(registry, parsed.shm.outputs),
    )  # fmt: skip
    assert [o.name for o in response.outputs] == ["Y", "Z"]
    assert list(response.raw_output_contents) == [b"", z.data]
    assert (SHM_ROOT / key[1:]).read_bytes()[8192 : 8192 + 16] == y.data


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"shared_memory_region": ("int64_param", 3), BYTE_SIZE: ("int64_param", 4)},
            "invalid value type for 'shared_memory_region' parameter for tensor 'A', "
            "expected string_param.",
        ),
        (
            {"shared_memory_region": ("string_param", "r"), BYTE_SIZE: ("uint64_param", 4)},
            "invalid value type for 'shared_memory_byte_size' parameter for tensor 'A', "
            "expected int64_param.",
        ),
        (
            {"shared_memory_region": ("string_param", "r")},
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
            "parameter for tensor 'A'",
        ),
        (
            {"shared_memory_offset": ("int64_param", 4)},
            "'shared_memory_offset' can not be specified without 'shared_memory_region' "
            "parameter for tensor 'A'",
        ),
    ],
)
def test_grpc_parameter_refusals(params: dict[str, tuple[str, object]], message: str) -> None:
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="A", datatype="FP32", shape=[1])
    for name, (field, value) in params.items():
        setattr(tensor.parameters[name], field, value)
    error = _error(grpc_parse, request)
    assert (error.code, error.message) == (ErrorCode.INVALID_ARG, message)


def test_grpc_output_in_shared_memory_cannot_be_classified() -> None:
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="m")
    output = request.outputs.add(name="Y")
    output.parameters["shared_memory_region"].string_param = "r"
    output.parameters["shared_memory_byte_size"].int64_param = 8
    output.parameters["classification"].int64_param = 2
    error = _error(grpc_parse, request)
    assert error.message == "output can't set both 'shared_memory_region' and 'classification'"


def test_http_parameter_types_refused() -> None:
    body = (
        b'{"inputs":[{"name":"A","shape":[1],"datatype":"FP32","parameters":'
        b'{"shared_memory_region":"r","shared_memory_byte_size":-4}}]}'
    )
    error = _error(lambda: http_parse(body, None, model="m"))
    assert error.message == (
        "Unable to parse 'shared_memory_byte_size' for input 'A' of model 'm': attempt to "
        "access JSON non-unsigned-integer as unsigned-integer"
    )


def test_header_cache_keeps_shared_memory_headers(key: str) -> None:
    """perf_analyzer sends the same header every time: the second request is built from
    the kept layout, and its input is read from the region again (new bytes there)."""
    from sluice.api.http.header_cache import HeaderCache

    inputs, outputs = _tensors(httpclient)
    body, length = http_request(inputs=inputs, outputs=outputs, custom_parameters=None, **_common())
    cache = HeaderCache()
    first, kept_first = cache.parse(body, length, model="m")
    second, kept = cache.parse(body, length, model="m")
    assert kept is not None and kept is kept_first
    assert second.shm == first.shm
    assert [t.data for t in second.inputs] == [b"", np.ones(4, dtype=np.float32).tobytes()]
    registry = SharedMemoryRegistry()
    registry.register_system("in", key, 0, 64)
    assert read_inputs(registry, second.inputs, second.shm.inputs)[0].data == bytes(range(32, 48))
    (SHM_ROOT / key[1:]).write_bytes(b"\xff" * 64)
    assert read_inputs(registry, second.inputs, second.shm.inputs)[0].data == b"\xff" * 16


@pytest.mark.skipif(
    cuda_runtime() is not None, reason="CUDA seen: tests/e2e/test_cuda_shared_memory.py"
)
def test_cuda_without_a_device_answers_as_triton_without_gpus(key: str) -> None:
    registry = SharedMemoryRegistry()
    error = _error(registry.register_cuda, "g", b"\0" * 64, 0, 64)
    assert (error.code, error.message) == (
        ErrorCode.INVALID_ARG,
        "failed to register CUDA shared memory region: 'g', GPUs not supported",
    )
    error = _error(registry.register_cuda, "", b"\0" * 64, 0, 64)
    assert error.message == "'region name' is necessary to register cuda shared memory region"
    assert registry.cuda_status() == []
    registry.unregister_cuda("g")  # not registered: nothing to do
    registry.unregister_cuda()
    error = _error(registry.cuda_status, "g")
    assert (error.code, error.message) == (
        ErrorCode.NOT_FOUND,
        "Unable to find cuda shared memory region: 'g'",
    )


def test_one_set_of_names_for_both_kinds(key: str) -> None:
    """A system region's name answers the CUDA status with Triton's wrong-kind text, and
    CUDA unregister leaves it alone."""
    registry = SharedMemoryRegistry()
    registry.register_system("s", key, 0, 64)
    error = _error(registry.cuda_status, "s")
    assert (error.code, error.message) == (
        ErrorCode.NOT_FOUND,
        "The region named 's' is registered as system shared memory, not CUDA shared memory",
    )
    registry.unregister_cuda("s")
    registry.unregister_cuda()
    assert [region["name"] for region in registry.system_status()] == ["s"]
    target = registry.slice("s", 8, 8)
    assert (len(target), target.read()) == (8, bytes(range(8, 16)))
    target.write(b"\xaa" * 4)
    assert registry.slice("s", 6, 8).read() == bytes([6, 7]) + b"\xaa" * 4 + bytes([12, 13])


def test_cuda_register_body_raw_handle() -> None:
    """The HTTP register body's ``raw_handle: {"b64": ...}``, as tritonclient.http sends it."""
    from sluice.api.http.shm_routes import _raw_handle

    assert _raw_handle({"raw_handle": {"b64": "AAECAw=="}}) == bytes([0, 1, 2, 3])
    for body, text in (
        ({}, "Shared memory register request has no 'raw_handle' field"),
        ({"raw_handle": "AAECAw=="}, "Unable to parse 'b64' of the shared memory register"),
        ({"raw_handle": {"b64": 7}}, "Unable to parse 'b64' of the shared memory register"),
        ({"raw_handle": {"b64": "@@"}}, "'raw_handle' of the shared memory register request"),
    ):
        error = _error(_raw_handle, body)
        assert error.code == ErrorCode.INVALID_ARG
        assert error.message.startswith(text), body
