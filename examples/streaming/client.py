"""Stream generated text from the ``textgen`` model token by token, over gRPC or over
HTTP Server-Sent Events, and print the time to first token and the tokens per second.

Usage::

    .venv/bin/python examples/streaming/build_model.py      # once: writes the model
    .venv/bin/sluice serve --model-repository examples/streaming/model_repository
    .venv/bin/python examples/streaming/client.py [--protocol grpc|sse] [--url URL]
        [--prompt TEXT] [--max-tokens N] [--temperature T] [--seed S] [--check]

``--protocol grpc`` (the default) sends the request on a ``tritonclient.grpc`` stream
(``start_stream`` / ``async_stream_infer`` with ``enable_empty_final_response``) to
``--url`` (default ``localhost:8001``); ``--protocol sse`` posts it to
``/v2/models/textgen/generate_stream`` (Triton's generate extension) at ``--url``
(default ``localhost:8000``) and reads the ``data:`` events as they arrive. Either way
each character is printed when it arrives. Then a line gives the number of tokens, the
time from sending the request to the first token, and the tokens per second after the
first (tokens 2..n over the time from the first to the last).

``--check`` runs the same generator in-process (``textgen_ngram.py`` with the model file
of ``--model-repository``, the one the server was started on) with the same prompt,
temperature and seed, and compares the texts. Exit code 0 when they are equal (or
without ``--check``), 1 when they differ, 2 when the server cannot be used.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import queue
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
MODEL = "textgen"
DEFAULT_REPOSITORY = HERE / "model_repository"
DEFAULT_PROMPT = "A class definition "
DEFAULT_URLS = {"grpc": "localhost:8001", "sse": "localhost:8000"}


class StreamError(RuntimeError):
    """The server refused or failed the request, or the stream broke."""


@dataclass
class Streamed:
    """What came back for one request.

    Attributes:
        tokens: the characters, in the order they arrived (one response each).
        arrivals: seconds from sending the request to each token's arrival, ``[n]``.
        stopped: the client stopped reading before the end (``stop_after``).
    """

    tokens: list[str] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    stopped: bool = False

    @property
    def text(self) -> str:
        """The generated text."""
        return "".join(self.tokens)

    @property
    def first_token_s(self) -> float:
        """Seconds from sending the request to the first token (nan without tokens)."""
        return self.arrivals[0] if self.arrivals else float("nan")

    @property
    def tokens_per_s(self) -> float:
        """Tokens 2..n per second from the first token's arrival to the last's (nan
        with fewer than two tokens)."""
        if len(self.arrivals) < 2 or self.arrivals[-1] <= self.arrivals[0]:
            return float("nan")
        return (len(self.arrivals) - 1) / (self.arrivals[-1] - self.arrivals[0])

    def summary(self) -> str:
        """One line: tokens, time to first token (ms), tokens per second."""
        return (
            f"{len(self.tokens)} tokens{' (stopped early)' if self.stopped else ''}; "
            f"time to first token {self.first_token_s * 1e3:.1f} ms; "
            f"{self.tokens_per_s:.0f} tokens/s after it"
        )


def _take(
    result: Streamed, token: str, started: float, on_token: Callable[[str], None] | None
) -> None:
    """Record ``token`` (arrival: seconds since ``started``) and pass it to ``on_token``."""
    result.arrivals.append(time.perf_counter() - started)
    result.tokens.append(token)
    if on_token is not None:
        on_token(token)


def stream_grpc(
    url: str, prompt: str, max_tokens: int, temperature: float = 0.8, seed: int | None = 1,
    on_token: Callable[[str], None] | None = None, stop_after: int | None = None,
    timeout_s: float = 30.0,
) -> Streamed:  # fmt: skip
    """Generate over a gRPC stream (``tritonclient.grpc``).

    Args:
        url: the server's gRPC ``host:port``.
        prompt: the text to continue (``text_input``).
        max_tokens: characters to generate (``max_tokens``, INT32).
        temperature: ``temperature`` (FP32).
        seed: ``seed`` (INT64; None: not sent, the model picks one).
        on_token: called with each character as it arrives.
        stop_after: close the stream, cancelling the request, after this many tokens.
        timeout_s: the longest wait for one response.

    Raises:
        StreamError: an error response, or no response within ``timeout_s``.
    """
    import tritonclient.grpc as grpcclient

    inputs = [_grpc_input("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES")]
    inputs.append(_grpc_input("max_tokens", np.array([max_tokens], dtype=np.int32), "INT32"))
    inputs.append(_grpc_input("temperature", np.array([temperature], dtype=np.float32), "FP32"))
    if seed is not None:
        inputs.append(_grpc_input("seed", np.array([seed], dtype=np.int64), "INT64"))
    arrived: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    result = Streamed()
    cancel = False
    try:
        client.start_stream(callback=lambda result, error: arrived.put((result, error)))
        started = time.perf_counter()
        client.async_stream_infer(
            MODEL, inputs, request_id="textgen-grpc", enable_empty_final_response=True
        )
        while True:
            try:
                answer, error = arrived.get(timeout=timeout_s)
            except queue.Empty:
                raise StreamError(f"no response within {timeout_s} s") from None
            if error is not None:
                raise StreamError(error.message() if hasattr(error, "message") else str(error))
            text = answer.as_numpy("text_output")
            if text is not None:
                _take(result, text.reshape(-1)[0].decode(), started, on_token)
            if answer.get_response().parameters["triton_final_response"].bool_param:
                return result
            if stop_after is not None and len(result.tokens) >= stop_after:
                result.stopped = cancel = True
                return result
    finally:
        client.stop_stream(cancel_requests=cancel)
        client.close()


def _grpc_input(name: str, array: np.ndarray, datatype: str) -> Any:
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def stream_sse(
    url: str, prompt: str, max_tokens: int, temperature: float = 0.8, seed: int | None = 1,
    on_token: Callable[[str], None] | None = None, stop_after: int | None = None,
    timeout_s: float = 30.0,
) -> Streamed:  # fmt: skip
    """Generate over HTTP: ``POST /v2/models/textgen/generate_stream``, one Server-Sent
    Event per token. Arguments as :func:`stream_grpc`, ``url`` the HTTP ``host:port``
    (or a ``http://`` base URL); ``stop_after`` closes the connection, which cancels the
    request.

    Raises:
        StreamError: the server answered an error (a status other than 200, or an
            ``error`` event), or nothing came within ``timeout_s``.
    """
    import requests

    base = url if url.startswith(("http://", "https://")) else f"http://{url}"
    body: dict[str, Any] = {
        "text_input": prompt, "max_tokens": max_tokens, "temperature": temperature,
        "id": "textgen-sse",
    }  # fmt: skip
    if seed is not None:
        body["seed"] = seed
    result = Streamed()
    started = time.perf_counter()
    try:
        response = requests.post(
            f"{base}/v2/models/{MODEL}/generate_stream", json=body, stream=True, timeout=timeout_s
        )
    except requests.RequestException as exc:
        raise StreamError(str(exc)) from exc
    with response:
        if response.status_code != 200:
            raise StreamError(f"HTTP {response.status_code}: {response.text}")
        pending = b""
        # chunk_size None: each chunk as it arrives (a size would wait to fill it)
        for chunk in response.iter_content(chunk_size=None):
            pending += chunk
            *events, pending = pending.split(b"\n\n")
            for event in events:
                for line in event.splitlines():
                    if not line.startswith(b"data:"):
                        continue
                    data = json.loads(line[5:])
                    if "error" in data:
                        raise StreamError(data["error"])
                    _take(result, data["text_output"], started, on_token)
                if stop_after is not None and len(result.tokens) >= stop_after:
                    result.stopped = True
                    return result  # leaving `with` closes the connection
    return result


def load_ngram(repository: Path = DEFAULT_REPOSITORY) -> ModuleType:
    """``textgen_ngram.py`` of the model in ``repository``, imported by path."""
    path = repository / MODEL / "1" / "textgen_ngram.py"
    spec = importlib.util.spec_from_file_location("sluice_example_textgen_ngram", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def generate_locally(
    repository: Path, prompt: str, max_tokens: int, temperature: float, seed: int | None
) -> str:
    """The text the model in ``repository`` generates in-process for these arguments
    (what the server must stream for the same seed)."""
    ngram = load_ngram(repository)
    model = ngram.CharNgram.load(repository / MODEL / "1" / "textgen.npz")
    return "".join(model.generate(prompt, max_tokens, temperature, seed))


def _print_token(token: str) -> None:
    sys.stdout.write(token)
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=("grpc", "sse"), default="grpc")
    parser.add_argument(
        "--url", help="gRPC host:port (default localhost:8001) or HTTP (default localhost:8000)"
    )
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"default {DEFAULT_PROMPT!r}")
    parser.add_argument("--max-tokens", type=int, default=200, help="default 200")
    parser.add_argument("--temperature", type=float, default=0.8, help="default 0.8")
    parser.add_argument("--seed", type=int, default=1, help="default 1")
    parser.add_argument(
        "--check", action="store_true", help="compare with the generator run in-process"
    )
    parser.add_argument(
        "--model-repository", type=Path, default=DEFAULT_REPOSITORY,
        help=f"for --check: the server's repository (default {DEFAULT_REPOSITORY})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    url = args.url or DEFAULT_URLS[args.protocol]
    stream = stream_grpc if args.protocol == "grpc" else stream_sse
    model_file = args.model_repository / MODEL / "1" / "textgen.npz"
    if args.check and not model_file.is_file():
        print(
            f"error: {model_file} not found; run "
            "`.venv/bin/python examples/streaming/build_model.py` first",
            file=sys.stderr,
        )
        return 2
    from tritonclient.utils import InferenceServerException

    _print_token(args.prompt)
    try:
        result = stream(
            url, args.prompt, args.max_tokens, args.temperature, args.seed, on_token=_print_token
        )
    except (StreamError, InferenceServerException, OSError) as exc:
        print(f"\nerror: streaming from {MODEL} at {url} failed: {exc}", file=sys.stderr)
        return 2
    print(f"\n[{args.protocol} {url}] {result.summary()}")
    if not args.check:
        return 0
    expected = generate_locally(
        args.model_repository, args.prompt, args.max_tokens, args.temperature, args.seed
    )
    if result.text == expected:
        print(f"check: OK, the same {len(expected)} characters as textgen run in-process")
        return 0
    same = next(
        (i for i, (a, b) in enumerate(zip(result.text, expected, strict=False)) if a != b),
        min(len(result.text), len(expected)),
    )
    print(
        f"check: MISMATCH from character {same}: streamed {result.text[same : same + 20]!r}, "
        f"in-process {expected[same : same + 20]!r} ({len(result.text)} vs {len(expected)} "
        "characters)"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
