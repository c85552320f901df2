"""A tritonserver launch command with flags Sluice does not implement starts Sluice."""

from __future__ import annotations

from pathlib import Path

import tritonclient.http as httpclient
from e2e_support import ROOT, repository_of, start_server, stop_server


def test_a_tritonserver_command_line_serves_and_warns_once_per_inert_flag(
    redis_url: str, tmp_path: Path
) -> None:
    repo = repository_of(ROOT / "examples" / "model_repository", tmp_path, "add_sub")
    server = start_server(
        repo, redis_url, tmp_path / "serve.log",
        "--backend-config=python,shm-default-byte-size=1048576",
        "--pinned-memory-pool-byte-size=0", "--cuda-memory-pool-byte-size", "0:0",
        "--allow-sagemaker=false", "--metrics-interval-ms=500.5",
    )  # fmt: skip
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("add_sub")
        lines = [line for line in server.log().splitlines() if "has no effect in Sluice" in line]
        assert [line.split("] ", 1)[1].split(" has no effect")[0] for line in lines] == [
            "--allow-sagemaker=false",
            "--backend-config=python,shm-default-byte-size=1048576",
            "--pinned-memory-pool-byte-size=0",
            "--cuda-memory-pool-byte-size=0:0",
        ]
    finally:
        assert stop_server(server) == 0, server.log()
