"""System shared memory end to end: regions made and filled by ``tritonclient.utils.shared_memory``,
registered with the server over HTTP and gRPC, inputs read from them and outputs written
into them by a real ``sluice serve``, and bad regions refused with Triton's texts and codes."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from e2e_support import (
    ROOT,
    Server,
    build_identity_types,
    children_running,
    start_server,
    stop_server,
)
from shm_support import NBYTES, A, B, by_protocol, raises, shm_request
from tritonclient.utils import InferenceServerException

from sluice.api.cuda_shared_memory import cuda_runtime


@pytest.fixture(scope="module")
def server(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server of three models (a small one starts and stops fast on a loaded machine)."""
    repo = tmp_path_factory.mktemp("shm-repo")
    shutil.copytree(ROOT / "examples" / "model_repository" / "add_sub", repo / "add_sub")
    build_identity_types(repo)
    decoupled = ROOT / "tests" / "assets" / "python_models" / "decoupled_repeat"
    shutil.copytree(decoupled, repo / "decoupled_repeat")
    started = start_server(repo, redis_url, repo.parent / "shm.log")
    try:
        yield started
    finally:
        assert stop_server(started) == 0, started.log()


class Regions:
    """POSIX shared-memory objects a test creates (unique keys), destroyed after it."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.tag = uuid.uuid4().hex[:10]

    def create(self, name: str, byte_size: int) -> tuple[Any, str]:
        key = f"/sluice_test_{self.tag}_{name}"
        handle = shm.create_shared_memory_region(name, key, byte_size)
        self.handles.append(handle)
        return handle, key


@pytest.fixture
def regions(http_client: Any) -> Iterator[Regions]:
    made = Regions()
    yield made
    http_client.unregister_system_shared_memory()
    for handle in made.handles:
        shm.destroy_shared_memory_region(handle)


def _add_sub_regions(regions: Regions, client: Any) -> tuple[Any, Any]:
    """``inputs`` (INPUT0 at 0, INPUT1 at 64) and ``outputs`` (128 bytes), registered."""
    inputs, in_key = regions.create(f"inputs_{regions.tag}", 2 * NBYTES)
    outputs, out_key = regions.create(f"outputs_{regions.tag}", 2 * NBYTES)
    shm.set_shared_memory_region(inputs, [A])
    shm.set_shared_memory_region(inputs, [B], offset=NBYTES)
    client.register_system_shared_memory(f"inputs_{regions.tag}", in_key, 2 * NBYTES)
    client.register_system_shared_memory(f"outputs_{regions.tag}", out_key, 2 * NBYTES)
    return inputs, outputs


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_from_and_outputs_into_shared_memory(
    protocol: str, http_client: Any, grpc_client: Any, regions: Regions
) -> None:
    client, module, _ = by_protocol(protocol, http_client, grpc_client)
    _, outputs = _add_sub_regions(regions, client)
    shm.set_shared_memory_region(outputs, [np.full((1, 32), -7.0, dtype=np.float32)])
    inputs, requested = shm_request(module, f"inputs_{regions.tag}", f"outputs_{regions.tag}")

    result = client.infer("add_sub", inputs, outputs=requested)

    for name in ("OUTPUT0", "OUTPUT1"):
        output = result.get_output(name)
        if protocol == "http":
            assert output == {"name": name, "datatype": "FP32", "shape": [1, 16]}  # no data
        else:
            assert (output.name, output.datatype, list(output.shape)) == (name, "FP32", [1, 16])
    if protocol == "grpc":
        assert list(result.get_response().raw_output_contents) == [b"", b""]
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs, np.float32, [1, 16]), A + B)
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(outputs, np.float32, [1, 16], offset=NBYTES), A - B
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_mixed_with_tensors_in_the_request(
    protocol: str, http_client: Any, grpc_client: Any, regions: Regions
) -> None:
    """One input from a region and one in the request; one output into a region and
    one in the response."""
    client, module, _ = by_protocol(protocol, http_client, grpc_client)
    _, outputs = _add_sub_regions(regions, client)
    inputs = [module.InferInput(f"INPUT{i}", [1, 16], "FP32") for i in range(2)]
    inputs[0].set_shared_memory(f"inputs_{regions.tag}", NBYTES)
    inputs[1].set_data_from_numpy(B * 4)
    requested = [module.InferRequestedOutput(f"OUTPUT{i}") for i in range(2)]
    requested[1].set_shared_memory(f"outputs_{regions.tag}", NBYTES, offset=NBYTES)

    result = client.infer("add_sub", inputs, outputs=requested)

    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B * 4)
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(outputs, np.float32, [1, 16], offset=NBYTES), A - B * 4
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_tensor_through_shared_memory(
    protocol: str, http_client: Any, grpc_client: Any, regions: Regions
) -> None:
    """A BYTES input is its serialized elements (4-byte length prefixes) in the region."""
    client, module, _ = by_protocol(protocol, http_client, grpc_client)
    from tritonclient.utils import serialize_byte_tensor, triton_to_np_dtype

    words = np.array([[b"alpha", b"", b"gamma\x00", b"d"]], dtype=np.object_)
    serialized = serialize_byte_tensor(words)  # a 0-d object array holding the bytes
    raw = serialized.item()
    region, key = regions.create(f"bytes_{regions.tag}", len(raw) + 16)
    shm.set_shared_memory_region(region, [serialized], offset=16)
    client.register_system_shared_memory(f"bytes_{regions.tag}", key, len(raw) + 16)
    tensor = module.InferInput("IN_BYTES", [1, 4], "BYTES")
    tensor.set_shared_memory(f"bytes_{regions.tag}", len(raw), offset=16)
    others = []  # the model's other inputs, in the request
    for datatype in ("FP32", "FP64", "FP16", "INT8", "INT32", "INT64", "UINT8", "BOOL"):
        other = module.InferInput(f"IN_{datatype}", [1, 4], datatype)
        other.set_data_from_numpy(np.ones((1, 4), dtype=triton_to_np_dtype(datatype)))
        others.append(other)

    result = client.infer(
        "identity_types", [tensor, *others], outputs=[module.InferRequestedOutput("OUT_BYTES")]
    )

    assert result.as_numpy("OUT_BYTES").tolist() == words.tolist()


def test_status_and_unregister_over_http(http_client: Any, regions: Regions) -> None:
    _, in_key = regions.create(f"a_{regions.tag}", 4096)
    _, out_key = regions.create(f"b_{regions.tag}", 256)
    http_client.register_system_shared_memory(f"a_{regions.tag}", in_key, 1024, offset=2048)
    http_client.register_system_shared_memory(f"b_{regions.tag}", out_key, 256)
    region_a = {"name": f"a_{regions.tag}", "key": in_key, "offset": 2048, "byte_size": 1024}
    region_b = {"name": f"b_{regions.tag}", "key": out_key, "offset": 0, "byte_size": 256}

    assert http_client.get_system_shared_memory_status() == [region_a, region_b]
    assert http_client.get_system_shared_memory_status(f"b_{regions.tag}") == [region_b]
    http_client.unregister_system_shared_memory(f"a_{regions.tag}")
    assert http_client.get_system_shared_memory_status() == [region_b]
    http_client.unregister_system_shared_memory(f"a_{regions.tag}")  # not registered: fine
    http_client.unregister_system_shared_memory()
    assert http_client.get_system_shared_memory_status() == []
    err = raises(http_client.get_system_shared_memory_status, f"b_{regions.tag}")
    assert err.status() == "404"
    assert err.message() == f"Unable to find system shared memory region: 'b_{regions.tag}'"


def test_status_and_unregister_over_grpc(grpc_client: Any, regions: Regions) -> None:
    _, key = regions.create(f"g_{regions.tag}", 8192)
    grpc_client.register_system_shared_memory(f"g_{regions.tag}", key, 4096, offset=4096)

    status = grpc_client.get_system_shared_memory_status(as_json=True)
    assert status == {
        "regions": {
            f"g_{regions.tag}": {
                "name": f"g_{regions.tag}",
                "key": key,
                "offset": "4096",
                "byte_size": "4096",
            }
        }
    }
    named = grpc_client.get_system_shared_memory_status(f"g_{regions.tag}")
    assert list(named.regions) == [f"g_{regions.tag}"]
    grpc_client.unregister_system_shared_memory(f"g_{regions.tag}")
    assert grpc_client.get_system_shared_memory_status(as_json=True) == {}
    err = raises(grpc_client.get_system_shared_memory_status, f"g_{regions.tag}")
    assert err.status() == "StatusCode.NOT_FOUND"


def test_region_offset_reads_the_right_bytes(http_client: Any, regions: Regions) -> None:
    """A region registered at an offset that is not a page multiple: tensor offsets count
    from the region's start."""
    region, key = regions.create(f"o_{regions.tag}", 8192)
    shm.set_shared_memory_region(region, [A], offset=4100)
    shm.set_shared_memory_region(region, [B], offset=4100 + NBYTES)
    http_client.register_system_shared_memory(f"o_{regions.tag}", key, 2 * NBYTES, offset=4100)
    inputs = [httpclient.InferInput(f"INPUT{i}", [1, 16], "FP32") for i in range(2)]
    inputs[0].set_shared_memory(f"o_{regions.tag}", NBYTES)
    inputs[1].set_shared_memory(f"o_{regions.tag}", NBYTES, offset=NBYTES)

    result = http_client.infer("add_sub", inputs)

    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_registrations_refused(
    protocol: str, http_client: Any, grpc_client: Any, regions: Regions
) -> None:
    client, _, codes = by_protocol(protocol, http_client, grpc_client)
    name = f"r_{regions.tag}"
    _, key = regions.create(name, 256)

    err = raises(client.register_system_shared_memory, name, key, 200, offset=100)
    assert (err.status(), err.message()) == (
        codes["INVALID_ARG"],
        f"failed to register shared memory region '{name}': invalid args",
    )
    missing = f"/sluice_test_{regions.tag}_missing"
    err = raises(client.register_system_shared_memory, name, missing, 64)
    assert (err.status(), err.message()) == (
        codes["INTERNAL"],
        f"Unable to open shared memory region: '{missing}'",
    )
    err = raises(client.register_system_shared_memory, name, "/../../etc/passwd", 64)
    assert err.message() == "Unable to open shared memory region: '/../../etc/passwd'"
    reserved = "/triton_python_backend_shm_region_1"
    err = raises(client.register_system_shared_memory, name, reserved, 64)
    assert err.status() == codes["INVALID_ARG"]
    assert "reserved prefix 'triton_python_backend_shm_region_'" in err.message()

    client.register_system_shared_memory(name, key, 256)
    err = raises(client.register_system_shared_memory, name, key, 128)
    assert (err.status(), err.message()) == (
        codes["ALREADY_EXISTS"],
        f"shared memory region '{name}' already in manager",
    )
    if cuda_runtime() is None:  # with a device: tests/e2e/test_cuda_shared_memory.py
        err = raises(client.register_cuda_shared_memory, "gpu", b"\0" * 64, 0, 64)
        assert (err.status(), err.message()) == (
            codes["INVALID_ARG"],
            "failed to register CUDA shared memory region: 'gpu', GPUs not supported",
        )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_tensor_regions_refused(
    protocol: str, http_client: Any, grpc_client: Any, regions: Regions
) -> None:
    client, module, codes = by_protocol(protocol, http_client, grpc_client)
    _add_sub_regions(regions, client)
    tag = regions.tag

    def infer(mutate: Any) -> InferenceServerException:
        inputs, outputs = shm_request(module, f"inputs_{tag}", f"outputs_{tag}")
        mutate(inputs, outputs)
        return raises(client.infer, "add_sub", inputs, outputs=outputs)

    err = infer(lambda i, o: i[0].set_shared_memory("nope", NBYTES))
    assert (err.status(), err.message()) == (
        codes["NOT_FOUND"],
        "Unable to find shared memory region: 'nope'",
    )
    err = infer(lambda i, o: i[1].set_shared_memory(f"inputs_{tag}", NBYTES, offset=NBYTES + 8))
    assert (err.status(), err.message()) == (
        codes["INVALID_ARG"],
        f"Invalid offset + byte size for shared memory region: 'inputs_{tag}'",
    )
    err = infer(lambda i, o: o[0].set_shared_memory(f"outputs_{tag}", 8, offset=2 * NBYTES))
    assert (err.status(), err.message()) == (
        codes["INVALID_ARG"],
        f"Invalid offset for shared memory region: 'outputs_{tag}'",
    )
    # a slice smaller than the tensor: the input fails the model's byte-size check
    err = infer(lambda i, o: i[0].set_shared_memory(f"inputs_{tag}", NBYTES // 2))
    assert err.status() == codes["INVALID_ARG"]
    assert err.message() == (
        "input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 64, got 32"
    )
    # ... and the output does not fit in its slice
    err = infer(lambda i, o: o[1].set_shared_memory(f"outputs_{tag}", NBYTES // 2))
    assert (err.status(), err.message()) == (
        codes["INTERNAL"],
        "shared memory size specified with the request for output 'OUTPUT1' (32 bytes) "
        "should be at least 64 bytes to hold the results",
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_truncated_object_refused_and_gateway_lives(
    protocol: str, server: Server, http_client: Any, grpc_client: Any, regions: Regions
) -> None:
    """A client shrinks its object after register: the infer that uses the region is
    refused naming it, and the gateway that served it keeps serving (no SIGBUS)."""
    client, module, codes = by_protocol(protocol, http_client, grpc_client)
    gateways = children_running(server, "sluice.api.gateway")
    assert gateways, server.log()
    tag = regions.tag
    name = f"big_{tag}"
    _, key = regions.create(name, 8192)
    client.register_system_shared_memory(name, key, 8192)
    _add_sub_regions(regions, client)
    os.truncate(f"/dev/shm{key}", 0)

    inputs, outputs = shm_request(module, f"inputs_{tag}", f"outputs_{tag}")
    inputs[0].set_shared_memory(name, NBYTES, offset=4096)
    err = raises(client.infer, "add_sub", inputs, outputs=outputs)
    assert (err.status(), err.message()) == (
        codes["INVALID_ARG"],
        f"shared memory region '{name}' is smaller than registered: its object '{key}' now "
        "holds 0 bytes, the region needs 8192",
    )
    inputs, outputs = shm_request(module, f"inputs_{tag}", f"outputs_{tag}")
    outputs[0].set_shared_memory(name, NBYTES, offset=4096)
    err = raises(client.infer, "add_sub", inputs, outputs=outputs)
    assert (err.status(), err.message()) == (
        codes["INVALID_ARG"],
        f"shared memory region '{name}' is smaller than registered: its object '{key}' now "
        "holds 0 bytes, the region needs 8192",
    )
    assert children_running(server, "sluice.api.gateway") == gateways, server.log()
    inputs, outputs = shm_request(module, f"inputs_{tag}", f"outputs_{tag}")
    client.infer("add_sub", inputs, outputs=outputs)  # the same gateway serves the next one
    assert children_running(server, "sluice.api.gateway") == gateways


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_nul_key_and_zero_size_refused(
    protocol: str, server: Server, http_client: Any, grpc_client: Any, regions: Regions
) -> None:
    client, _, codes = by_protocol(protocol, http_client, grpc_client)
    name = f"r_{regions.tag}"
    _, key = regions.create(name, 256)
    tracebacks = server.log().count("Traceback")
    err = raises(client.register_system_shared_memory, name, "/ev\x00x", 64)
    assert (err.status(), err.message()) == (
        codes["INTERNAL"],
        "Unable to open shared memory region: '/ev\x00x'",
    )
    err = raises(client.register_system_shared_memory, name, key, 0)
    assert (err.status(), err.message()) == (
        codes["INVALID_ARG"],
        f"failed to register shared memory region '{name}': byte_size must be greater than 0 "
        "(a zero-length region cannot be mapped)",
    )
    err = raises(client.get_system_shared_memory_status, name)  # nothing registered
    assert err.status() == codes["NOT_FOUND"]
    assert server.log().count("Traceback") == tracebacks


def test_output_in_shared_memory_cannot_be_classified(
    server: Any, http_client: Any, regions: Regions
) -> None:
    """tritonclient refuses it itself; a hand-written request gets Triton's 400."""
    _add_sub_regions(regions, http_client)
    tensor = {"datatype": "FP32", "shape": [1, 16], "data": A.ravel().tolist()}
    region = {"shared_memory_region": f"outputs_{regions.tag}", "shared_memory_byte_size": 64}
    for extra, key in (
        ({"classification": 2}, "classification"),
        ({"binary_data": True}, "binary_data"),
    ):
        body = {
            "inputs": [{"name": "INPUT0", **tensor}, {"name": "INPUT1", **tensor}],
            "outputs": [{"name": "OUTPUT0", "parameters": {**region, **extra}}],
        }
        answer = requests.post(
            f"http://{server.http_url}/v2/models/add_sub/infer", json=body, timeout=30
        )
        assert (answer.status_code, answer.json()) == (
            400,
            {"error": f"Output can't set both 'shared_memory_region' and '{key}'"},
        )


def test_unregistered_region_no_longer_serves(http_client: Any, regions: Regions) -> None:
    _add_sub_regions(regions, http_client)
    http_client.unregister_system_shared_memory(f"inputs_{regions.tag}")
    inputs, outputs = shm_request(httpclient, f"inputs_{regions.tag}", f"outputs_{regions.tag}")
    err = raises(http_client.infer, "add_sub", inputs, outputs=outputs)
    assert (err.status(), err.message()) == (
        "404",
        f"Unable to find shared memory region: 'inputs_{regions.tag}'",
    )


def test_server_advertises_system_shared_memory(http_client: Any, grpc_client: Any) -> None:
    assert "system_shared_memory" in http_client.get_server_metadata()["extensions"]
    assert "system_shared_memory" in grpc_client.get_server_metadata().extensions
    assert "cuda_shared_memory" not in http_client.get_server_metadata()["extensions"]


def test_async_job_cannot_use_shared_memory(server: Any) -> None:
    """A job runs later, elsewhere: a tensor that names a region is refused at submit."""
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}
    region = {"shared_memory_region": "r", "shared_memory_byte_size": 64}
    body = {
        "inputs": [
            {**tensor, "parameters": region},
            {**tensor, "name": "INPUT1", "data": [0.0] * 16},
        ]
    }
    answer = requests.post(
        f"http://{server.http_url}/v2/models/add_sub/jobs", json=body, timeout=30
    )
    assert (answer.status_code, answer.json()) == (
        501,
        {
            "error": "input 'INPUT0' of model 'add_sub': shared memory cannot be used by an "
            "async job"
        },
    )


def test_decoupled_stream_cannot_use_shared_memory(server: Any, regions: Regions) -> None:
    """A decoupled model's many responses have no one place in a region: refused in-band."""
    import queue

    _, key = regions.create(f"d_{regions.tag}", 64)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    try:
        client.register_system_shared_memory(f"d_{regions.tag}", key, 64)
        client.start_stream(callback=lambda result, error: results.put(error or result))
        tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_shared_memory(f"d_{regions.tag}", 4)
        client.async_stream_infer("decoupled_repeat", [tensor], request_id="1")
        answer = results.get(timeout=30)
        client.stop_stream()
    finally:
        client.close()
    assert isinstance(answer, InferenceServerException)
    assert answer.message() == (
        "input 'IN' of model 'decoupled_repeat': shared memory cannot be used by a decoupled "
        "model's responses"
    )
