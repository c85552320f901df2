"""Trace flags, the trace extension's settings and sampling, the trace context in the
Redis message, and Triton's trace file writer."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sluice.api.frontend_flags import (
    add_frontend_arguments,
    apply_frontend_arguments,
    forward_frontend_arguments,
)
from sluice.api.request_trace import TraceFile, Tracing, header_traceparent
from sluice.api.settings import GatewaySettings, TraceConfig
from sluice.api.trace_settings import TraceSettings
from sluice.broker.codec import decode_request, encode_request
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.messages import InferRequestMessage, WireTensor


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_frontend_arguments(parser)
    return parser


def test_trace_config_forms_and_deprecated_flags_apply() -> None:
    argv = [
        "--trace-config", "mode=opentelemetry",
        "--trace-config", "opentelemetry,url=http://collector:4318/v1/traces",
        "--trace-config", "opentelemetry,resource=service.name=sluice",
        "--trace-config", "opentelemetry,resource=deployment=test",
        "--trace-config", "opentelemetry,bsp_schedule_delay=250",
        "--trace-config", "level=TIMESTAMPS",
        "--trace-rate", "7",
        "--trace-count", "100",
        "--trace-file", "/tmp/t.json",
        "--trace-log-frequency", "50",
    ]  # fmt: skip
    args = _parser().parse_args(argv)
    trace = apply_frontend_arguments(GatewaySettings(), args).trace
    assert trace == TraceConfig(
        mode="opentelemetry",
        level=["TIMESTAMPS"],
        rate=7,
        count=100,
        file="/tmp/t.json",
        log_frequency=50,
        url="http://collector:4318/v1/traces",
        resource=["service.name=sluice", "deployment=test"],
        bsp_schedule_delay_ms=250,
    )
    # sluice serve hands them to its gateway as --trace-config, which gives the same
    forwarded = forward_frontend_arguments(args)
    pairs = list(zip(forwarded[::2], forwarded[1::2], strict=True))
    assert ("--trace-config", "triton,file=/tmp/t.json") in pairs
    assert ("--trace-config", "rate=7") in pairs
    assert {flag for flag, _ in pairs} == {"--trace-config"}
    again = apply_frontend_arguments(GatewaySettings(), _parser().parse_args(forwarded))
    assert again.trace == trace


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace-config", "level=LOUD"], "expected one of OFF, TIMESTAMPS, TENSORS"),
        (["--trace-config", "rate=-1"], "expected an integer >= 0"),
        (["--trace-config", "count=-2"], "expected -1 (no limit) or an integer >= 0"),
        (["--trace-config", "zipkin,url=x"], "unknown trace mode 'zipkin'"),
        (["--trace-config", "triton,url=x"], "setting one of file, log-frequency"),
        (["--trace-config", "opentelemetry,resource=novalue"], "expected <key>=<value>"),
        (["--trace-level", "ALL"], "expected one of OFF, TIMESTAMPS, TENSORS"),
        (["--trace-config", "rate=1_0"], "not an integer"),
        (["--trace-config", "count=99999999999999999999"], "out of range"),
        (["--trace-config", "triton,file=/nonexistent/dir/t.json"], "does not exist"),
    ],
)
def test_bad_trace_flags_are_refused_by_name(argv: list[str], message: str) -> None:
    with pytest.raises(argparse.ArgumentError) as info:
        _parser().parse_args(argv)
    assert message in str(info.value)


def test_levels_rate_and_count_sample_as_triton() -> None:
    settings = TraceSettings(TraceConfig(level=["TIMESTAMPS"], rate=3, count=2))
    assert settings.active
    picks = [settings.sample("m", forced=False) for _ in range(12)]
    # the 3rd and the 6th request are traced, then the count is used up
    assert [i + 1 for i, p in enumerate(picks) if p] == [3, 6]
    assert settings.as_dict()["trace_count"] == "0"
    assert settings.sample("m", forced=True)  # a client's traceparent: always
    off = TraceSettings(TraceConfig())
    assert not off.active
    assert not off.sample("m", forced=True)


def test_model_settings_follow_the_global_ones_where_not_set() -> None:
    settings = TraceSettings(TraceConfig(level=["OFF"], rate=1000))
    assert not settings.active
    model = settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}, "m")
    assert (model["trace_level"], model["trace_rate"]) == (["TIMESTAMPS"], "1")
    assert settings.active  # one model traces: requests leave the task-free path
    settings.update({"log_frequency": "9"})
    assert settings.as_dict("m")["log_frequency"] == "9"
    assert settings.as_dict("other")["trace_level"] == ["OFF"]
    assert settings.sample("m", forced=False)
    assert not settings.sample("other", forced=False)
    settings.update({"trace_level": None, "trace_rate": None}, "m")
    assert settings.as_dict("m") == settings.as_dict()
    assert not settings.active


@pytest.mark.parametrize(
    ("changes", "code", "text"),
    [
        ({"trace_file": "x"}, ErrorCode.UNSUPPORTED, "trace file location can not be updated"),
        ({"trace_mode": "triton"}, ErrorCode.UNSUPPORTED, "trace mode can not be updated"),
        ({"trace_level": ["X"]}, ErrorCode.INVALID_ARG, "unsupported trace level 'X'"),
        ({"trace_level": 3}, ErrorCode.INVALID_ARG, "expect an array of strings"),
        ({"trace_rate": "1.5"}, ErrorCode.INVALID_ARG, "Unable to parse 'trace_rate'"),
        ({"trace_count": "-2"}, ErrorCode.INVALID_ARG, "Unable to parse 'trace_count'"),
        ({"trace_count": "9" * 23}, ErrorCode.INVALID_ARG, "Unable to parse 'trace_count'"),
        ({"trace_rate": " 7 "}, ErrorCode.INVALID_ARG, "Unable to parse 'trace_rate'"),
        ({"trace_rate": "1_0"}, ErrorCode.INVALID_ARG, "Unable to parse 'trace_rate'"),
        ({"trace_rate": "\u0661\u0662"}, ErrorCode.INVALID_ARG, "Unable to parse 'trace_rate'"),
        ({"verbosity": "1"}, ErrorCode.INVALID_ARG, "unknown trace setting 'verbosity'"),
    ],
)
def test_bad_updates_change_nothing(changes: dict, code: ErrorCode, text: str) -> None:
    settings = TraceSettings(TraceConfig(level=["TIMESTAMPS"]))
    before = settings.as_dict()
    with pytest.raises(SluiceError) as info:
        settings.update({"trace_rate": "5", **changes})
    assert info.value.code is code
    assert text in info.value.message
    assert settings.as_dict() == before


def _message(trace: dict[str, str]) -> InferRequestMessage:
    return InferRequestMessage(
        "r1", "", "m", 1, (WireTensor("IN", "FP32", (1, 1), b"\0\0\0\0"),), (), {}, "k", 9, 8,
        trace=trace,
    )  # fmt: skip


def test_trace_context_travels_only_with_traced_requests() -> None:
    plain = encode_request(_message({}))
    context = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "url": "http://c"}
    traced = encode_request(_message(context))
    assert decode_request(traced).trace == context
    assert decode_request(plain).trace == {}
    # an untraced request's message is the layout without tracing: a msgpack array of 13
    # fields; a traced one has the same 13 and its context as a 14th
    assert (plain[0], traced[0]) == (0x9D, 0x9E)
    assert traced[1:].startswith(plain[1:])


def test_traceparent_from_http_headers_and_grpc_metadata() -> None:
    assert header_traceparent([(b"host", b"x"), (b"traceparent", b"00-a-b-01")]) == "00-a-b-01"
    assert header_traceparent([("traceparent", "00-c-d-01")]) == "00-c-d-01"
    assert header_traceparent([(b"host", b"x")]) is None


def test_trace_file_every_n_traces_then_the_rest_at_exit(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    writer = TraceFile(str(path))
    for i in range(5):
        writer.add([{"id": i}], log_frequency=2)
    writer.close(log_frequency=2)
    assert [json.loads(Path(f"{path}.{k}").read_text()) for k in range(3)] == [
        [{"id": 0}, {"id": 1}],
        [{"id": 2}, {"id": 3}],
        [{"id": 4}],
    ]
    once = TraceFile(str(tmp_path / "once.json"))
    once.add([{"id": 1}], log_frequency=0)
    once.add([{"id": 2}], log_frequency=0)
    assert not (tmp_path / "once.json").exists()
    once.close(log_frequency=0)
    assert json.loads((tmp_path / "once.json").read_text()) == [{"id": 1}, {"id": 2}]


def test_opentelemetry_mode_carries_the_exporter_settings() -> None:
    tracing = Tracing(
        TraceConfig(
            mode="opentelemetry",
            level=["TIMESTAMPS"],
            url="http://c:4318/v1/traces",
            resource=["a=b", "c=d"],
            bsp_schedule_delay_ms=100,
        )
    )
    assert tracing.carried("00-x-y-01") == {
        "traceparent": "00-x-y-01",
        "url": "http://c:4318/v1/traces",
        "resource": "a=b,c=d",
        "bsp": ",100,",
    }
    assert tracing.carried("") == {}


def test_the_http_task_free_path_is_left_only_while_something_traces() -> None:
    """With every level OFF an infer request takes the task-free path as without tracing;
    once the global or a model's level traces, infer requests take the ASGI route (where
    they are stamped), and take the task-free path again once it is OFF."""
    from types import SimpleNamespace

    from sluice.api.http.infer import InferEndpoint

    tracing = Tracing(TraceConfig())
    dataplane = SimpleNamespace(
        submission=None, settings=GatewaySettings(), tracing=tracing, shared_memory=None
    )
    endpoint = InferEndpoint(app=None, dataplane=dataplane)  # type: ignore[arg-type]
    scope = {
        "method": "POST",
        "path": "/v2/models/m/infer",
        "headers": [(b"content-length", b"64")],
    }
    assert endpoint.accepts(scope) == ("m", None)
    tracing.settings.update({"trace_level": ["TIMESTAMPS"]}, "other")
    assert endpoint.accepts(scope) is None
    tracing.settings.update({}, "other")
    assert endpoint.accepts(scope) == ("m", None)
    tracing.settings.update({"trace_level": ["TIMESTAMPS"]})
    assert endpoint.accepts(scope) is None
    tracing.settings.update({"trace_level": ["OFF"]})
    assert endpoint.accepts(scope) == ("m", None)
