"""sluice.gpu_workers.warmup: model_warmup samples become execute calls
(docs/user-guide/backends.md, "Model warm-up")."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.gpu_workers.backends.base import (
    InferError,
    InferRequest,
    InferResponse,
    InstanceContext,
)
from sluice.gpu_workers.warmup import WarmupError, build_requests, run_warmup

BASE = """
name: "m"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] },
        { name: "S" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def _config(warmup: str, base: str = BASE) -> ModelConfig:
    return text_format.Parse(base + warmup, ModelConfig())


def _ctx(config: ModelConfig, model_dir: Path) -> InstanceContext:
    return InstanceContext("m", 1, config, "m_0", "CPU", 0, model_dir, model_dir / "1")


class Recorder:
    """A backend that records every execute call and can fail on request."""

    def __init__(self, answer: InferError | None = None, raise_: bool = False) -> None:
        self.calls: list[Sequence[InferRequest]] = []
        self.answer = answer
        self.raise_ = raise_

    def initialize(self, ctx: InstanceContext) -> None:
        pass

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse | InferError]:
        self.calls.append(requests)
        if self.raise_:
            raise ValueError("boom")
        if self.answer is not None:
            return [self.answer for _ in requests]
        return [InferResponse({}) for _ in requests]

    def finalize(self) -> None:
        pass


def _sample(body: str) -> str:
    return f"model_warmup [ {{ {body} }} ]\n"


ZERO = (
    'inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } '
    'inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } }'
)


@pytest.mark.parametrize(
    ("batch_size", "count", "calls", "requests_per_call"),
    [(1, 0, 1, 1), (2, 3, 3, 2), (8, 1, 1, 8), (0, 5, 0, 0)],
)
def test_count_and_batch_size_shape_the_calls(
    tmp_path: Path, batch_size: int, count: int, calls: int, requests_per_call: int
) -> None:
    config = _config(_sample(f'name: "s" batch_size: {batch_size} count: {count} {ZERO}'))
    backend = Recorder()
    assert run_warmup(backend, _ctx(config, tmp_path)) == calls
    assert [len(c) for c in backend.calls] == [requests_per_call] * calls
    for call in backend.calls:
        for request in call:
            assert request.inputs["A"].shape == (1, 2)
            assert request.inputs["A"].dtype == np.float32
            assert request.inputs["A"].tolist() == [[0.0, 0.0]]
            assert request.inputs["S"].dtype == object
            assert request.inputs["S"].tolist() == [[b"", b""]]


def test_samples_run_in_order(tmp_path: Path) -> None:
    config = _config(
        "model_warmup [ "
        f'{{ name: "first" batch_size: 1 {ZERO} }}, '
        f'{{ name: "second" batch_size: 3 {ZERO} }} ]\n'
    )
    backend = Recorder()
    assert run_warmup(backend, _ctx(config, tmp_path)) == 2
    assert [len(c) for c in backend.calls] == [1, 3]
    assert backend.calls[1][0].request_id == "warmup-second-0"


def test_random_data_is_valid_and_bytes_fall_back_to_zero(tmp_path: Path) -> None:
    base = """
name: "m"
max_batch_size: 0
input [ { name: "F" data_type: TYPE_FP64 dims: [ 64 ] },
        { name: "I" data_type: TYPE_UINT8 dims: [ 64 ] },
        { name: "B" data_type: TYPE_BOOL dims: [ 64 ] },
        { name: "S" data_type: TYPE_STRING dims: [ 3 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
    inputs = " ".join(
        f'inputs {{ key: "{n}" value: {{ data_type: {t} dims: [ {d} ] random_data: true }} }}'
        for n, t, d in (
            ("F", "TYPE_FP64", 64),
            ("I", "TYPE_UINT8", 64),
            ("B", "TYPE_BOOL", 64),
            ("S", "TYPE_STRING", 3),
        )
    )
    config = _config(_sample(f'name: "r" batch_size: 1 {inputs}'), base)
    (request,) = build_requests(config, config.model_warmup[0], tmp_path, np.random.default_rng(1))
    assert request.inputs["F"].shape == (64,)  # no batch dimension: max_batch_size 0
    assert ((request.inputs["F"] >= 0) & (request.inputs["F"] < 1)).all()
    assert request.inputs["F"].std() > 0
    assert request.inputs["I"].dtype == np.uint8 and request.inputs["I"].max() < 128
    assert request.inputs["B"].dtype == np.bool_
    assert request.inputs["S"].tolist() == [b"", b"", b""]


def test_input_data_file(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup/a.bin").write_bytes(struct.pack("<3f", 1.5, -2.0, 9.0))  # one extra
    strings = b"".join(struct.pack("<I", len(s)) + s for s in (b"hi", b"\xff\x00"))
    (tmp_path / "warmup/s.bin").write_bytes(strings)
    config = _config(
        _sample(
            'name: "f" batch_size: 2 '
            'inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 2 ] '
            'input_data_file: "a.bin" } } '
            'inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] '
            'input_data_file: "s.bin" } }'
        )
    )
    requests = build_requests(config, config.model_warmup[0], tmp_path, np.random.default_rng())
    assert len(requests) == 2
    for request in requests:
        assert request.inputs["A"].tolist() == [[1.5, -2.0]]
        assert request.inputs["A"].flags.writeable
        assert request.inputs["S"].tolist() == [[b"hi", b"\xff\x00"]]


@pytest.mark.parametrize(
    ("files", "spec", "message"),
    [
        (
            {"a.bin": b"\0" * 7},
            'input_data_file: "a.bin"',
            "failed to run warmup sample 'bad' of model 'm': input 'A': warmup setting expects 8 "
            "bytes, but the data provided from 'a.bin' only has 7 bytes",
        ),
        ({}, 'input_data_file: "nope.bin"', "input 'A': warmup data file '"),
        ({}, "", "input 'A' sets none of zero_data, random_data, input_data_file"),
    ],
)
def test_bad_input_fails_with_sample_name(
    tmp_path: Path, files: dict[str, bytes], spec: str, message: str
) -> None:
    (tmp_path / "warmup").mkdir()
    for name, data in files.items():
        (tmp_path / "warmup" / name).write_bytes(data)
    config = _config(
        _sample(
            f'name: "bad" batch_size: 1 inputs {{ key: "A" value: '
            f"{{ data_type: TYPE_FP32 dims: [ 2 ] {spec} }} }}"
        )
    )
    with pytest.raises(WarmupError) as info:
        run_warmup(Recorder(), _ctx(config, tmp_path))
    assert message in str(info.value)
    assert str(info.value).startswith("failed to run warmup sample 'bad' of model 'm': ")


def test_variable_dims_and_oversized_batch_are_refused(tmp_path: Path) -> None:
    config = _config(
        _sample(
            'name: "v" batch_size: 1 inputs { key: "A" value: '
            "{ data_type: TYPE_FP32 dims: [ -1 ] zero_data: true } }"
        )
    )
    with pytest.raises(WarmupError, match="variable-size dims"):
        run_warmup(Recorder(), _ctx(config, tmp_path))
    config = _config(_sample(f'name: "big" batch_size: 9 {ZERO}'))
    with pytest.raises(WarmupError, match="batch_size 9 exceeds the model's max_batch_size 8"):
        run_warmup(Recorder(), _ctx(config, tmp_path))


def test_error_response_or_exception_fails_the_load(tmp_path: Path) -> None:
    config = _config(_sample(f'name: "s" batch_size: 2 count: 4 {ZERO}'))
    failing = Recorder(InferError("INVALID_ARG", "negative input"))
    with pytest.raises(WarmupError) as info:
        run_warmup(failing, _ctx(config, tmp_path))
    assert str(info.value) == "failed to run warmup sample 's' of model 'm': negative input"
    assert len(failing.calls) == 1  # stops at the first failure
    with pytest.raises(WarmupError, match="sample 's' of model 'm': ValueError: boom"):
        run_warmup(Recorder(raise_=True), _ctx(config, tmp_path))


def test_no_warmup_no_calls(tmp_path: Path) -> None:
    backend = Recorder()
    assert run_warmup(backend, _ctx(_config(""), tmp_path)) == 0
    assert backend.calls == []
