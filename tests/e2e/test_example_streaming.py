"""The streaming example (``examples/streaming``): ``build_model.py`` counts a character
n-gram model, a real ``sluice serve`` runs it as the decoupled model ``textgen``, and
``client.py`` streams its text one character per response over gRPC and over SSE. The
streamed text must equal the generator run in-process with the same seed."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from e2e_support import ROOT, Server, load_module, start_server, stop_server

EXAMPLE = ROOT / "examples" / "streaming"
PROMPT = "An exception "


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository with ``textgen``, written by the example's own build script."""
    out = tmp_path_factory.mktemp("streaming-example")
    build = subprocess.run(
        [sys.executable, str(EXAMPLE / "build_model.py"), "--out", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    assert (out / "textgen" / "1" / "textgen.npz").is_file()
    return out


@pytest.fixture(scope="module")
def server(repository: Path, redis_url: str) -> Iterator[Server]:
    """``sluice serve`` on the example repository (a key prefix of its own)."""
    started = start_server(repository, redis_url, repository.parent / "streaming-serve.log")
    try:
        yield started
    finally:
        stop_server(started)


@pytest.fixture(scope="module")
def client() -> object:
    """``examples/streaming/client.py`` as a module."""
    return load_module("examples/streaming/client.py", "sluice_example_streaming_client")


def _assert_streamed(result: object, expected: str, count: int) -> None:
    tokens, arrivals = result.tokens, result.arrivals  # type: ignore[attr-defined]
    assert "".join(tokens) == expected
    assert len(tokens) == count and all(len(t) == 1 for t in tokens)  # one response each
    assert arrivals == sorted(arrivals) and arrivals[0] < arrivals[-1]
    assert result.first_token_s > 0 and result.tokens_per_s > 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("protocol", ["grpc", "sse"])
def test_streamed_text_equals_the_generator_in_process(
    server: Server, repository: Path, client: object, protocol: str
) -> None:
    """300 characters, each its own response, in order; the text is the in-process
    generator's for the same prompt, temperature and seed."""
    seed = 11 if protocol == "grpc" else 12
    expected = client.generate_locally(repository, PROMPT, 300, 0.8, seed)  # type: ignore[attr-defined]
    if protocol == "grpc":
        result = client.stream_grpc(server.grpc_url, PROMPT, 300, 0.8, seed)  # type: ignore[attr-defined]
    else:
        result = client.stream_sse(server.http_url, PROMPT, 300, 0.8, seed)  # type: ignore[attr-defined]
    _assert_streamed(result, expected, 300)
    assert len(set(expected)) > 10  # real text, not one character repeated


def test_concurrent_requests_get_their_own_text(
    server: Server, repository: Path, client: object
) -> None:
    """A gRPC and an SSE request at once, greedy and sampled: neither gets the other's
    characters."""
    results: dict[str, object] = {}
    calls = {
        "grpc": lambda: client.stream_grpc(server.grpc_url, PROMPT, 250, 0.0, 3),  # type: ignore[attr-defined]
        "sse": lambda: client.stream_sse(server.http_url, PROMPT, 250, 1.2, 4),  # type: ignore[attr-defined]
    }
    threads = [
        threading.Thread(target=lambda k=k: results.__setitem__(k, calls[k]())) for k in calls
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    local = client.generate_locally  # type: ignore[attr-defined]
    _assert_streamed(results["grpc"], local(repository, PROMPT, 250, 0.0, 3), 250)
    _assert_streamed(results["sse"], local(repository, PROMPT, 250, 1.2, 4), 250)


@pytest.mark.parametrize("protocol", ["sse", "grpc"])
def test_a_cancelled_request_stops_generating(
    server: Server, client: object, protocol: str
) -> None:
    """The client stops reading after 10 of 100000 characters (closes the SSE connection,
    or closes the gRPC stream cancelling its request): the model sees is_cancelled() and
    stops, logging how far it got, long before the end."""
    stream = client.stream_sse if protocol == "sse" else client.stream_grpc  # type: ignore[attr-defined]
    url = server.http_url if protocol == "sse" else server.grpc_url
    result = stream(url, PROMPT, 100_000, 0.8, 5, stop_after=10)
    assert result.stopped and len(result.tokens) == 10
    pattern = re.compile(rf"request 'textgen-{protocol}' cancelled after (\d+) of 100000 tokens")
    deadline = time.monotonic() + 10
    while not (found := pattern.search(server.log())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert found, f"the model never saw the cancellation:\n{server.log()[-2000:]}"
    assert 10 <= int(found.group(1)) < 20_000


def test_an_invalid_request_is_refused_before_streaming(server: Server) -> None:
    """max_tokens out of range: a 400 JSON error, no event stream."""
    response = requests.post(
        f"{server.base}/v2/models/textgen/generate_stream",
        json={"text_input": "x", "max_tokens": -1}, timeout=30,
    )  # fmt: skip
    assert response.status_code == 400
    assert response.json() == {"error": "textgen: max_tokens must be 0..100000"}


def test_client_command_line_checks_the_text(server: Server, repository: Path) -> None:
    """``client.py --check`` as a user runs it: the streamed text, the timing line and an
    OK check, exit code 0."""
    run = subprocess.run(
        [sys.executable, str(EXAMPLE / "client.py"), "--url", server.grpc_url, "--check",
         "--model-repository", str(repository), "--max-tokens", "120"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"120 tokens; time to first token [\d.]+ ms; \d+ tokens/s", run.stdout)
    assert "check: OK, the same 120 characters as textgen run in-process" in run.stdout


def test_client_check_flags_another_model(
    server: Server, client: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--check against a different model (order 3, not the server's): exit code 1 and a
    MISMATCH line."""
    build = load_module("examples/streaming/build_model.py", "sluice_example_streaming_build")
    build.build(tmp_path, order=3)  # type: ignore[attr-defined]
    code = client.main(  # type: ignore[attr-defined]
        ["--protocol", "sse", "--url", server.http_url, "--check", "--model-repository",
         str(tmp_path), "--max-tokens", "100"]
    )  # fmt: skip
    assert code == 1
    assert "check: MISMATCH from character" in capsys.readouterr().out
