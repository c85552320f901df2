"""CUDA shared memory end to end: device regions made and filled by
``tritonclient.utils.cuda_shared_memory``, registered by raw IPC handle over HTTP and gRPC,
inputs copied out of them and outputs copied into them by a real ``sluice serve``, status
and unregister, and bad regions refused with Triton's texts and codes.

Every test here is marked ``gpu`` and skips cleanly where the CUDA bindings
(``cuda-bindings`` / ``cuda-python``, which tritonclient's CUDA utilities need) are missing
or see no device. On a GPU machine run ``pytest -m gpu tests/e2e``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from e2e_support import Server, start_server, stop_server
from shm_support import NBYTES, A, B, by_protocol, raises, shm_request
from tritonclient.utils import InferenceServerException

from sluice.api.cuda_shared_memory import cuda_runtime

pytestmark = [pytest.mark.e2e, pytest.mark.gpu]

if cuda_runtime() is None:
    pytest.skip("no CUDA bindings or no CUDA device", allow_module_level=True)
try:
    import tritonclient.utils.cuda_shared_memory as cudashm
except (ImportError, RuntimeError) as exc:  # tritonclient raises RuntimeError without them
    pytest.skip(f"tritonclient's CUDA utilities do not import: {exc}", allow_module_level=True)


@pytest.fixture(scope="module")
def server(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, examples: Any
) -> Iterator[Server]:
    """A server of ``add_sub`` (FP32 [1, 16] in, sum and difference out), built here (a
    bare GPU machine has no example repository built)."""
    repo = tmp_path_factory.mktemp("cudashm-repo")
    examples.build_add_sub(repo)
    started = start_server(repo, redis_url, repo.parent / "cudashm.log")
    try:
        yield started
    finally:
        assert stop_server(started) == 0, started.log()


class Regions:
    """CUDA regions a test allocates on device 0 (unique names), freed after it."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.tag = uuid.uuid4().hex[:10]

    def create(self, name: str, byte_size: int) -> Any:
        handle = cudashm.create_shared_memory_region(f"{name}_{self.tag}", byte_size, 0)
        self.handles.append(handle)
        return handle


@pytest.fixture
def regions(http_client: Any) -> Iterator[Regions]:
    made = Regions()
    yield made
    http_client.unregister_cuda_shared_memory()
    http_client.unregister_system_shared_memory()
    for handle in made.handles:
        cudashm.destroy_shared_memory_region(handle)


def _register(client: Any, regions: Regions, name: str, handle: Any, byte_size: int) -> str:
    full = f"{name}_{regions.tag}"
    client.register_cuda_shared_memory(full, cudashm.get_raw_handle(handle), 0, byte_size)
    return full


def _add_sub_regions(regions: Regions, client: Any) -> tuple[str, Any, str]:
    """``inputs`` (INPUT0 at 0, INPUT1 at 64) and ``outputs`` (128 bytes, filled with
    -7), registered: (inputs name, outputs handle, outputs name)."""
    inputs = regions.create("in", 2 * NBYTES)
    outputs = regions.create("out", 2 * NBYTES)
    cudashm.set_shared_memory_region(inputs, [A, B])
    cudashm.set_shared_memory_region(outputs, [np.full((1, 32), -7.0, dtype=np.float32)])
    in_name = _register(client, regions, "in", inputs, 2 * NBYTES)
    out_name = _register(client, regions, "out", outputs, 2 * NBYTES)
    return in_name, outputs, out_name


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_from_and_outputs_into_cuda_regions(
    protocol: str, http_client: Any, grpc_client: Any, regions: Regions
) -> None:
    client, module, _ = by_protocol(protocol, http_client, grpc_client)
    in_name, outputs, out_name = _add_sub_regions(regions, client)
    inputs, requested = shm_request(module, in_name, out_name)

    result = client.infer("add_sub", inputs, outputs=requested)

    for name in ("OUTPUT0", "OUTPUT1"):
        output = result.get_output(name)
        if protocol == "http":
            assert output == {"name": name, "datatype": "FP32", "shape": [1, 16]}  # no data
        else:
            assert (output.name, output.datatype, list(output.shape)) == (name, "FP32", [1, 16])
    written = cudashm.get_contents_as_numpy(outputs, np.float32, [2, 16])
    np.testing.assert_array_equal(written[0:1], A + B)
    np.testing.assert_array_equal(written[1:2], A - B)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_inputs_with_outputs_in_the_response(
    protocol: str, http_client: Any, grpc_client: Any, regions: Regions
) -> None:
    """Inputs from a CUDA region at an offset, outputs answered in the response."""
    client, module, _ = by_protocol(protocol, http_client, grpc_client)
    handle = regions.create("mixed", 3 * NBYTES)
    cudashm.set_shared_memory_region(handle, [np.zeros_like(A), B, A])
    name = _register(client, regions, "mixed", handle, 3 * NBYTES)
    inputs = [module.InferInput(f"INPUT{i}", [1, 16], "FP32") for i in range(2)]
    inputs[0].set_shared_memory(name, NBYTES, offset=2 * NBYTES)  # A
    inputs[1].set_shared_memory(name, NBYTES, offset=NBYTES)  # B

    result = client.infer("add_sub", inputs)

    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_status_and_unregister_over_http(http_client: Any, regions: Regions) -> None:
    first = _register(http_client, regions, "a", regions.create("a", 1024), 1024)
    second = _register(http_client, regions, "b", regions.create("b", 256), 256)
    region_a = {"name": first, "device_id": 0, "byte_size": 1024}
    region_b = {"name": second, "device_id": 0, "byte_size": 256}

    assert http_client.get_cuda_shared_memory_status() == [region_a, region_b]
    assert http_client.get_cuda_shared_memory_status(second) == [region_b]
    http_client.unregister_cuda_shared_memory(first)
    assert http_client.get_cuda_shared_memory_status() == [region_b]
    http_client.unregister_cuda_shared_memory(first)  # not registered: fine
    http_client.unregister_cuda_shared_memory()
    assert http_client.get_cuda_shared_memory_status() == []
    err = raises(http_client.get_cuda_shared_memory_status, second)
    assert (err.status(), err.message()) == (
        "404",
        f"Unable to find cuda shared memory region: '{second}'",
    )


def test_status_and_unregister_over_grpc(grpc_client: Any, regions: Regions) -> None:
    name = _register(grpc_client, regions, "g", regions.create("g", 4096), 4096)

    status = grpc_client.get_cuda_shared_memory_status()
    assert list(status.regions) == [name]
    region = status.regions[name]
    assert (region.name, region.device_id, region.byte_size) == (name, 0, 4096)
    assert list(grpc_client.get_cuda_shared_memory_status(name).regions) == [name]
    grpc_client.unregister_cuda_shared_memory(name)
    assert list(grpc_client.get_cuda_shared_memory_status().regions) == []
    err = raises(grpc_client.get_cuda_shared_memory_status, name)
    assert err.status() == "StatusCode.NOT_FOUND"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_registrations_refused(
    protocol: str, http_client: Any, grpc_client: Any, regions: Regions
) -> None:
    client, _, codes = by_protocol(protocol, http_client, grpc_client)
    handle = regions.create("r", 256)
    raw = cudashm.get_raw_handle(handle)
    name = f"r_{regions.tag}"

    err = raises(client.register_cuda_shared_memory, name, raw, 99, 256)
    assert err.status() == codes["INVALID_ARG"]
    assert err.message().startswith(
        f"failed to register CUDA shared memory region '{name}': failed to open CUDA IPC handle: "
    )
    err = raises(client.register_cuda_shared_memory, name, b"AAAA", 0, 256)  # 3 bytes
    assert err.status() == codes["INVALID_ARG"]
    assert err.message() == (
        f"failed to register CUDA shared memory region '{name}': "
        "failed to open CUDA IPC handle: invalid argument"
    )
    client.register_cuda_shared_memory(name, raw, 0, 256)
    err = raises(client.register_cuda_shared_memory, name, raw, 0, 256)
    assert (err.status(), err.message()) == (
        codes["ALREADY_EXISTS"],
        f"shared memory region '{name}' already in manager",
    )
    # one set of names for both kinds, as in Triton
    key = f"/sluice_test_{regions.tag}_sys"
    system = shm.create_shared_memory_region(f"s_{regions.tag}", key, 64)
    try:
        err = raises(client.register_system_shared_memory, name, key, 64)
        assert err.message() == f"shared memory region '{name}' already in manager"
        client.register_system_shared_memory(f"s_{regions.tag}", key, 64)
        err = raises(client.get_cuda_shared_memory_status, f"s_{regions.tag}")
        assert (err.status(), err.message()) == (
            codes["NOT_FOUND"],
            f"The region named 's_{regions.tag}' is registered as system shared memory, "
            "not CUDA shared memory",
        )
        client.unregister_system_shared_memory(f"s_{regions.tag}")
    finally:
        shm.destroy_shared_memory_region(system)


def test_bad_http_register_bodies_refused(server: Server, regions: Regions) -> None:
    url = f"http://{server.http_url}/v2/cudasharedmemory/region/h_{regions.tag}/register"
    for body, text in (
        ({"device_id": 0, "byte_size": 64}, "has no 'raw_handle' field"),
        ({"raw_handle": {"b64": "@@@"}, "device_id": 0, "byte_size": 64}, "is not base64"),
        ({"raw_handle": {"b64": 5}, "device_id": 0, "byte_size": 64}, "'b64'"),
        ({"raw_handle": {"b64": "AAAA"}, "device_id": 0}, "has no 'byte_size' field"),
        ({"raw_handle": {"b64": "AAAA"}, "device_id": -1, "byte_size": 64}, "'device_id'"),
    ):
        response = requests.post(url, json=body, timeout=30)
        assert response.status_code == 400, body
        assert text in response.json()["error"], body


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_tensor_regions_refused(
    protocol: str, http_client: Any, grpc_client: Any, regions: Regions
) -> None:
    client, module, codes = by_protocol(protocol, http_client, grpc_client)
    in_name, _, out_name = _add_sub_regions(regions, client)

    def infer(mutate: Any) -> InferenceServerException:
        inputs, outputs = shm_request(module, in_name, out_name)
        mutate(inputs, outputs)
        return raises(client.infer, "add_sub", inputs, outputs=outputs)

    err = infer(lambda i, o: i[0].set_shared_memory("nope", NBYTES))
    assert (err.status(), err.message()) == (
        codes["NOT_FOUND"],
        "Unable to find shared memory region: 'nope'",
    )
    err = infer(lambda i, o: i[1].set_shared_memory(in_name, NBYTES, offset=NBYTES + 8))
    assert (err.status(), err.message()) == (
        codes["INVALID_ARG"],
        f"Invalid offset + byte size for shared memory region: '{in_name}'",
    )
    err = infer(lambda i, o: o[0].set_shared_memory(out_name, 8, offset=2 * NBYTES))
    assert (err.status(), err.message()) == (
        codes["INVALID_ARG"],
        f"Invalid offset for shared memory region: '{out_name}'",
    )
    err = infer(lambda i, o: o[1].set_shared_memory(out_name, NBYTES // 2))
    assert (err.status(), err.message()) == (
        codes["INTERNAL"],
        "shared memory size specified with the request for output 'OUTPUT1' (32 bytes) "
        "should be at least 64 bytes to hold the results",
    )


def test_unregistered_region_no_longer_serves(http_client: Any, regions: Regions) -> None:
    in_name, _, out_name = _add_sub_regions(regions, http_client)
    http_client.unregister_cuda_shared_memory(in_name)
    inputs, outputs = shm_request(httpclient, in_name, out_name)
    err = raises(http_client.infer, "add_sub", inputs, outputs=outputs)
    assert (err.status(), err.message()) == (
        "404",
        f"Unable to find shared memory region: '{in_name}'",
    )
