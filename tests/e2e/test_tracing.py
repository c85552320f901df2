"""The trace extension end to end: OpenTelemetry spans received by a real OTLP/HTTP
endpoint, Triton's JSON trace file, and the trace settings over HTTP and gRPC."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e_support import Server, free_port, start_server, stop_server, write_scale_model
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

#: the batching model's delay window: a lone request waits this long for company, in µs
#: (long beside the client's own overhead, which the 10% bounds must absorb)
DELAY_US = 200_000


class OtlpReceiver:
    """An OTLP/HTTP trace endpoint (``POST /v1/traces``, protobuf) on a free port that
    keeps every span it receives, with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest.FromString(body)
                receiver.add(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def add(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    with self.lock:
                        self.spans.append(
                            {
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "attributes": {a.key: _value(a.value) for a in span.attributes},
                                "events": [e.name for e in span.events],
                                "resource": resource,
                            }
                        )

    def trace(self, trace_id: str, names: set[str], timeout_s: float = 30.0) -> dict[str, dict]:
        """The spans of ``trace_id`` by name, once all of ``names`` arrived (bounded)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                found = {s["name"]: s for s in self.spans if s["trace_id"] == trace_id}
            if names <= set(found) or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(any_value: Any) -> Any:
    return getattr(any_value, any_value.WhichOneof("value"))


def _ms(span: dict) -> float:
    return (span["end"] - span["start"]) / 1e6


SPAN_NAMES = {
    "InferRequest",
    "gateway_request",
    "queue",
    "compute",
    "compute_input",
    "compute_infer",
    "compute_output",
    "gateway_response",
}


def _batching_repo(root: Path) -> Path:
    """``traced``: OUTPUT0 = 2 × INPUT0 [-1, 4], dynamic batching with a 200 ms window."""
    repo = root / "models"
    write_scale_model(repo / "traced/1/model.onnx", 2.0)
    (repo / "traced/config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f"dynamic_batching {{ max_queue_delay_microseconds: {DELAY_US} }}\n"
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )
    return repo


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    otlp = OtlpReceiver()
    yield otlp
    otlp.close()


@pytest.fixture(scope="module")
def otel_server(
    receiver: OtlpReceiver, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("otel")
    srv = start_server(
        _batching_repo(root),
        redis_url,
        root / "serve.log",
        "--trace-config", "mode=opentelemetry",
        "--trace-config", f"opentelemetry,url={receiver.url}",
        "--trace-config", "opentelemetry,resource=service.name=sluice-e2e",
        "--trace-config", "opentelemetry,bsp_schedule_delay=100",
        "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "rate=1",
    )  # fmt: skip
    yield srv
    assert stop_server(srv) == 0, srv.log()


@pytest.fixture(scope="module")
def triton_server(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Path]]:
    root = tmp_path_factory.mktemp("tritontrace")
    trace_file = root / "trace.json"
    srv = start_server(
        _batching_repo(root),
        redis_url,
        root / "serve.log",
        "--trace-config", f"triton,file={trace_file}",
        "--trace-config", "triton,log-frequency=1",
        "--trace-level", "TIMESTAMPS",
        "--trace-rate", "1",
    )  # fmt: skip
    yield srv, trace_file
    assert stop_server(srv) == 0, srv.log()


def _inputs(module: Any) -> tuple[list[Any], np.ndarray]:
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(data)
    return [tensor], data


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def test_one_request_is_one_trace_across_gateway_and_instance(
    otel_server: Server, receiver: OtlpReceiver
) -> None:
    """A request through a batching model: the gateway's span is the child of the
    client's ``traceparent``; the instance process exports queue and compute spans as
    its children, compute's three parts under compute; the children cover the
    gateway's span, which is the request's latency, each within 10%."""
    client = httpclient.InferenceServerClient(otel_server.http_url, network_timeout=30)
    inputs, data = _inputs(httpclient)
    client.infer("traced", inputs)  # the first request also reads the model's view
    traceparent, trace_id, client_span = _traceparent()
    started = time.perf_counter_ns()
    result = client.infer("traced", inputs, headers={"traceparent": traceparent})
    latency_ms = (time.perf_counter_ns() - started) / 1e6
    client.close()
    assert result.as_numpy("OUTPUT0").tolist() == (2 * data).tolist()

    spans = receiver.trace(trace_id, SPAN_NAMES)
    assert set(spans) == SPAN_NAMES, f"spans of the trace: {sorted(spans)}"
    root = spans["InferRequest"]
    assert root["parent"] == client_span
    for name in ("gateway_request", "queue", "compute", "gateway_response"):
        assert spans[name]["parent"] == root["span_id"], name
    for name in ("compute_input", "compute_infer", "compute_output"):
        assert spans[name]["parent"] == spans["compute"]["span_id"], name
    # the gateway's spans and the instance's come from two processes
    gateway, instance = root["resource"], spans["compute"]["resource"]
    assert (gateway["sluice.role"], instance["sluice.role"]) == ("gateway", "instance")
    assert gateway["process.pid"] != instance["process.pid"]
    assert gateway["service.name"] == instance["service.name"] == "sluice-e2e"
    assert spans["queue"]["resource"] == instance
    assert spans["compute"]["attributes"]["model_name"] == "traced"
    assert spans["compute"]["attributes"]["model_version"] == 1
    assert "queue_start" in root["events"] and "compute_end" in root["events"]
    # the batch waited in its delay window (time in Redis and the batcher: queue)
    assert _ms(spans["queue"]) >= 0.5 * DELAY_US / 1000
    children = sum(
        _ms(spans[n]) for n in ("gateway_request", "queue", "compute", "gateway_response")
    )
    assert children == pytest.approx(_ms(root), rel=0.10)
    parts = sum(_ms(spans[n]) for n in ("compute_input", "compute_infer", "compute_output"))
    assert parts == pytest.approx(_ms(spans["compute"]), rel=0.10, abs=0.05)
    assert _ms(root) == pytest.approx(latency_ms, rel=0.10)
    assert _ms(root) <= latency_ms


def test_grpc_request_with_traceparent_metadata(
    otel_server: Server, receiver: OtlpReceiver
) -> None:
    client = grpcclient.InferenceServerClient(otel_server.grpc_url)
    inputs, data = _inputs(grpcclient)
    traceparent, trace_id, client_span = _traceparent()
    result = client.infer("traced", inputs, headers={"traceparent": traceparent})
    client.close()
    assert result.as_numpy("OUTPUT0").tolist() == (2 * data).tolist()
    spans = receiver.trace(trace_id, SPAN_NAMES)
    assert set(spans) == SPAN_NAMES
    assert spans["InferRequest"]["parent"] == client_span
    assert spans["queue"]["parent"] == spans["InferRequest"]["span_id"]
    assert "grpc_waitread_start" in spans["InferRequest"]["events"]


def test_sampled_requests_without_traceparent_start_their_own_trace(
    otel_server: Server, receiver: OtlpReceiver
) -> None:
    """rate=1: every request is traced; one without a client context is a root."""
    before = {s["trace_id"] for s in receiver.spans}
    client = httpclient.InferenceServerClient(otel_server.http_url, network_timeout=30)
    inputs, _ = _inputs(httpclient)
    client.infer("traced", inputs, request_id="mine")
    client.close()
    deadline = time.monotonic() + 30
    roots: list[dict] = []
    while not roots and time.monotonic() < deadline:
        with receiver.lock:
            roots = [
                s
                for s in receiver.spans
                if s["name"] == "InferRequest"
                and s["trace_id"] not in before
                and s["attributes"].get("request_id") == "mine"
            ]
        time.sleep(0.05)
    assert len(roots) == 1
    assert roots[0]["parent"] == ""
    spans = receiver.trace(roots[0]["trace_id"], SPAN_NAMES)
    assert spans["compute"]["parent"] == roots[0]["span_id"]


def test_triton_mode_writes_the_json_trace_file(
    triton_server: tuple[Server, Path],
) -> None:
    server, trace_file = triton_server
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
    inputs, _ = _inputs(httpclient)
    client.infer("traced", inputs, request_id="req-7")
    client.close()
    first = Path(f"{trace_file}.0")  # log-frequency=1: every trace is a file of its own
    deadline = time.monotonic() + 10
    while not first.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    entries = json.loads(first.read_text())
    assert entries[0] == {
        "id": 1,
        "model_name": "traced",
        "model_version": 1,
        "request_id": "req-7",
    }
    assert entries[1]["id"] == 1
    names = [stamp["name"] for stamp in entries[1]["timestamps"]]
    assert names == [
        "HTTP_RECV_START",
        "HTTP_RECV_END",
        "REQUEST_START",
        "QUEUE_START",
        "COMPUTE_START",
        "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START",
        "COMPUTE_END",
        "REQUEST_END",
        "HTTP_SEND_START",
        "HTTP_SEND_END",
    ]
    stamps = {s["name"]: s["ns"] for s in entries[1]["timestamps"]}
    assert stamps["COMPUTE_START"] - stamps["QUEUE_START"] >= 0.5 * DELAY_US * 1000


def test_trace_settings_over_http(triton_server: tuple[Server, Path]) -> None:
    server, trace_file = triton_server
    base = server.base
    initial = {
        "trace_file": str(trace_file),
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "log_frequency": "1",
        "trace_mode": "triton",
    }
    assert requests.get(f"{base}/v2/trace/setting", timeout=10).json() == initial
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.get_trace_settings() == initial
    assert "trace" in client.get_server_metadata()["extensions"]
    # a model's own values; the rest follows the global settings, later changes included
    model = client.update_trace_settings("traced", {"trace_rate": "5"})
    assert model == {**initial, "trace_rate": "5"}
    assert client.update_trace_settings(settings={"trace_count": "10"})["trace_count"] == "10"
    assert client.get_trace_settings("traced") == {**initial, "trace_rate": "5"}
    glob = client.update_trace_settings(settings={"log_frequency": "3"})
    assert client.get_trace_settings("traced")["log_frequency"] == "3"
    assert glob["trace_rate"] == "1"
    # null clears the model's own value
    cleared = client.update_trace_settings("traced", {"trace_rate": None})
    assert cleared["trace_rate"] == "1"
    # refused: the file, a bad level, a bad rate, an unknown model
    with pytest.raises(InferenceServerException) as info:
        client.update_trace_settings(settings={"trace_file": "other.json"})
    assert info.value.status() == "501"
    assert "trace file location can not be updated" in info.value.message()
    response = requests.post(f"{base}/v2/trace/setting", json={"trace_level": ["LOUD"]}, timeout=10)
    assert response.status_code == 400
    assert "unsupported trace level 'LOUD'" in response.json()["error"]
    response = requests.post(f"{base}/v2/trace/setting", json={"trace_rate": "x"}, timeout=10)
    assert response.status_code == 400
    assert "Unable to parse 'trace_rate'" in response.json()["error"]
    response = requests.get(f"{base}/v2/models/nope/trace/setting", timeout=10)
    assert (response.status_code, response.json()) == (
        404,
        {"error": "Request for unknown model : nope"},
    )
    client.update_trace_settings(settings={"trace_count": "-1", "log_frequency": "1"})
    client.close()


def test_trace_settings_over_grpc(triton_server: tuple[Server, Path]) -> None:
    server, _ = triton_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    settings = client.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_level"] == {"value": ["TIMESTAMPS"]}
    assert settings["trace_mode"] == {"value": ["triton"]}
    updated = client.update_trace_settings(
        "traced", {"trace_level": ["OFF"], "trace_count": "2"}, as_json=True
    )["settings"]
    assert updated["trace_level"] == {"value": ["OFF"]}
    assert updated["trace_count"] == {"value": ["2"]}
    http = requests.get(f"{server.base}/v2/models/traced/trace/setting", timeout=10).json()
    assert http["trace_level"] == ["OFF"] and http["trace_count"] == "2"
    try:
        client.update_trace_settings(settings={"trace_mode": "opentelemetry"})
    except InferenceServerException as exc:
        assert exc.status() == "StatusCode.UNIMPLEMENTED"
    else:
        raise AssertionError("trace_mode changed at run time")
    # a key without values clears the model's own value
    client.update_trace_settings("traced", {"trace_level": None, "trace_count": None})
    assert client.get_trace_settings("traced", as_json=True)["settings"]["trace_level"] == {
        "value": ["TIMESTAMPS"]
    }
    client.close()


def test_triton_mode_with_log_frequency_0_writes_the_file_at_exit(
    triton_server: tuple[Server, Path],
) -> None:
    """The last test of the module: it stops the server."""
    server, trace_file = triton_server
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
    assert client.update_trace_settings(settings={"log_frequency": "0"})["log_frequency"] == "0"
    inputs, _ = _inputs(httpclient)
    client.infer("traced", inputs, request_id="at-exit")
    client.close()
    assert not trace_file.exists()  # kept in memory until the gateway exits
    assert stop_server(server) == 0, server.log()
    entries = json.loads(trace_file.read_text())
    assert [e["request_id"] for e in entries if "model_name" in e] == ["at-exit"]
    assert [len(e["timestamps"]) for e in entries if "timestamps" in e] == [11]
