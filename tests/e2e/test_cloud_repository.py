"""Cloud model repositories: ``sluice serve --model-repository s3://host:port/bucket/path``
against a local S3-compatible server (moto), driven by tritonclient over HTTP and gRPC:
serving, poll mode seeing a version uploaded, explicit loads reading the bucket anew, and
a missing bucket refused at start with one error line."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e_support import Server, start_server, stop_server
from s3_support import AWS_ENV, LocalS3, local_s3

pytestmark = pytest.mark.e2e

#: how long a poll or a load may take to show a version uploaded to the bucket, in s.
CHANGE_DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def s3() -> Iterator[LocalS3]:
    with local_s3() as server:
        yield server


@pytest.fixture(scope="module")
def add_sub_dir(examples: object, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the example ``add_sub`` model (``add_sub/config.pbtxt``, ``1/``)."""
    folder = tmp_path_factory.mktemp("add_sub_src")
    examples.build_add_sub(folder)  # type: ignore[attr-defined]
    return folder


def _bucket(s3: LocalS3, add_sub_dir: Path) -> str:
    """A new bucket with ``models/add_sub`` (version 1) in it."""
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    s3.client.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    s3.upload(bucket, "models", add_sub_dir)
    return bucket


def _inputs(module: object, seed: int) -> tuple[list[object], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((1, 16)).astype(np.float32)
    b = rng.standard_normal((1, 16)).astype(np.float32)
    tensors = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(name, [1, 16], "FP32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors, a, b


def _assert_add_sub(server: Server, version: str = "") -> None:
    """add_sub answers exactly over HTTP and over gRPC (``version`` "" = the latest)."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        tensors, a, b = _inputs(httpclient, 1)
        result = client.infer("add_sub", tensors, model_version=version)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensors, a, b = _inputs(grpcclient, 2)
        result = client.infer("add_sub", tensors, model_version=version)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def _wait_ready(server: Server, version: str) -> None:
    deadline = time.monotonic() + CHANGE_DEADLINE_S
    with httpclient.InferenceServerClient(server.http_url) as client:
        while not client.is_model_ready("add_sub", version):
            assert time.monotonic() < deadline, f"version {version} not ready:\n{server.log()}"
            time.sleep(0.2)


def _local_copy(server: Server) -> Path:
    """The folder the server copied the bucket into (from its log line)."""
    match = re.search(r"\(local copy (\S+)\)", server.log())
    assert match is not None, server.log()
    return Path(match.group(1))


def test_poll_mode_serves_a_bucket_and_sees_a_new_version(
    s3: LocalS3, add_sub_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    bucket = _bucket(s3, add_sub_dir)
    server = start_server(
        s3.url(bucket, "models"),
        redis_url,
        tmp_path / "serve.log",
        "--model-control-mode=poll",
        "--repository-poll-secs=1",
        env=AWS_ENV,
    )
    try:
        _assert_add_sub(server)
        copy = _local_copy(server)
        assert (copy / "add_sub/1/model.onnx").read_bytes() == (
            add_sub_dir / "add_sub/1/model.onnx"
        ).read_bytes()
        # version 2 appears in the bucket: the next poll copies it and serves it alone
        # (add_sub's version policy is Triton's default, the latest one)
        model = (add_sub_dir / "add_sub/1/model.onnx").read_bytes()
        s3.client.put_object(Bucket=bucket, Key="models/add_sub/2/model.onnx", Body=model)  # type: ignore[attr-defined]
        _wait_ready(server, "2")
        _assert_add_sub(server, "2")
        assert (copy / "add_sub/2/model.onnx").is_file()
        with httpclient.InferenceServerClient(server.http_url) as client:
            index = {e.get("version"): e["state"] for e in client.get_model_repository_index()}
        assert index.get("2") == "READY", index
    finally:
        code = stop_server(server)
    assert code == 0, server.log()
    assert "Traceback" not in server.log()
    assert not copy.exists(), "the temporary copy outlived the server"


def test_explicit_load_reads_the_bucket_again(
    s3: LocalS3, add_sub_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    bucket = _bucket(s3, add_sub_dir)
    server = start_server(
        s3.url(bucket, "models"),
        redis_url,
        tmp_path / "serve.log",
        "--model-control-mode=explicit",
        env=AWS_ENV,
    )
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            assert not client.is_model_ready("add_sub")
            client.load_model("add_sub")
            assert client.is_model_ready("add_sub", "1")
            _assert_add_sub(server, "1")
            config = client.get_model_config("add_sub")
            assert config["max_batch_size"] > 0, config
            # a new version and a changed config in the bucket: the next load copies both
            text = (add_sub_dir / "add_sub/config.pbtxt").read_text()
            text = re.sub(r"max_batch_size:\s*\d+", "max_batch_size: 3", text)
            s3.client.put_object(Bucket=bucket, Key="models/add_sub/config.pbtxt", Body=text)  # type: ignore[attr-defined]
            model = (add_sub_dir / "add_sub/1/model.onnx").read_bytes()
            s3.client.put_object(Bucket=bucket, Key="models/add_sub/2/model.onnx", Body=model)  # type: ignore[attr-defined]
            client.load_model("add_sub")
            assert client.is_model_ready("add_sub", "2")
            assert not client.is_model_ready("add_sub", "1")
            assert client.get_model_config("add_sub")["max_batch_size"] == 3
        _assert_add_sub(server, "2")
    finally:
        code = stop_server(server)
    assert code == 0, server.log()


def test_missing_bucket_is_one_clear_error_at_start(
    s3: LocalS3, redis_url: str, tmp_path: Path
) -> None:
    url = s3.url("no-such-bucket", "models")
    server = start_server(
        url,
        redis_url,
        tmp_path / "serve.log",
        env=AWS_ENV,
        wait_ready=False,
    )
    try:
        code = server.process.wait(60)
    finally:
        stop_server(server)
    log = server.log()
    assert code == 1, log
    assert "Traceback" not in log
    errors = [line for line in log.splitlines() if line.startswith("E")]  # glog's E lines
    assert len(errors) == 1, log
    assert (
        f"failed to open model repository '{url}': The specified bucket does not exist"
        in (errors[0])
    )
