"""sluice.gpu_workers.backends.python: Triton model.py files run unchanged
(docs/reference/python-backend.md)."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc.model_config_pb2 import DataType

from sluice.gpu_workers.backends import registry
from sluice.gpu_workers.backends.base import (
    InferError,
    InferRequest,
    InferResponse,
    InstanceContext,
)
from sluice.gpu_workers.backends.python import pb_utils
from sluice.gpu_workers.backends.python.backend import PythonBackend
from sluice.gpu_workers.backends.python.pb_utils import bls
from sluice.repository import ConfigError, ModelSource, load_model_config

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "python_models"


def _context(name: str, root: Path = ASSETS) -> InstanceContext:
    loaded = load_model_config(
        ModelSource(name, root / name, root), autocomplete=registry.auto_complete
    )
    config = loaded.config
    version = loaded.versions[-1]
    return InstanceContext(
        model_name=name,
        model_version=version,
        config=config,
        instance_name=f"{name}_0_0",
        kind="CPU",
        device_id=0,
        model_dir=root / name,
        version_dir=root / name / str(version),
    )


@pytest.fixture
def load() -> Iterator:
    backends: list[PythonBackend] = []

    def _load(name: str, root: Path = ASSETS) -> PythonBackend:
        backend = PythonBackend()
        backend.initialize(_context(name, root))
        backends.append(backend)
        return backend

    yield _load
    for backend in backends:
        backend.finalize()


def _bytes(*items: bytes, shape: tuple[int, ...] | None = None) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = list(items)
    return array.reshape(shape or (len(items),))


def _request(
    rid: str = "r", outputs: tuple[str, ...] = (), params: dict | None = None, **inputs: np.ndarray
) -> InferRequest:
    return InferRequest(rid, f"client-{rid}", dict(inputs), outputs, params or {})


def _ok(result: InferResponse | InferError) -> dict[str, np.ndarray]:
    assert isinstance(result, InferResponse), result
    return result.outputs


def _write_model(root: Path, name: str, config: str, code: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(code))


# --- uppercase -----------------------------------------------------------------------


def test_uppercase_bytes_including_empty_and_non_utf8(load) -> None:
    backend = load("uppercase")
    data = _bytes(b"abc", b"", b"\xff\x00", shape=(1, 3))
    out = _ok(backend.execute([_request(INPUT0=data)])[0])
    assert list(out) == ["OUTPUT0"]
    assert out["OUTPUT0"].dtype == object
    assert out["OUTPUT0"].shape == (1, 3)
    assert out["OUTPUT0"].tolist() == [[b"ABC", b"", b"\xff\x00"]]


def test_read_only_inputs_are_handed_over_writable(load) -> None:
    backend = load("add")
    a = np.frombuffer(np.ones(4, np.float32).tobytes(), np.float32).reshape(1, 4)
    assert not a.flags.writeable
    out = _ok(backend.execute([_request(A=a, B=a)])[0])
    np.testing.assert_array_equal(out["SUM"], np.full((1, 4), 2, np.float32))


# --- add: Triton batching semantics ------------------------------------------------


def test_add_gets_every_request_in_one_execute(load) -> None:
    backend = load("add")
    requests = [
        _request(
            str(i),
            A=np.arange(4 * b, dtype=np.float32).reshape(b, 4),
            B=np.full((b, 4), i, np.float32),
        )
        for i, b in enumerate((1, 2, 3))
    ]
    results = backend.execute(requests)
    assert len(results) == 3
    for i, (request, result) in enumerate(zip(requests, results, strict=True)):
        out = _ok(result)
        b = request.inputs["A"].shape[0]
        np.testing.assert_array_equal(out["SUM"], request.inputs["A"] + i)
        assert out["SUM"].dtype == np.float32
        assert out["EXEC_SIZE"].dtype == np.int32
        assert out["EXEC_SIZE"].tolist() == [[3]] * b


def test_requested_outputs_filter(load) -> None:
    backend = load("add")
    a = np.zeros((1, 4), np.float32)
    out = _ok(backend.execute([_request(outputs=("EXEC_SIZE",), A=a, B=a)])[0])
    assert list(out) == ["EXEC_SIZE"]
    assert out["EXEC_SIZE"].tolist() == [[1]]


# --- raiser: per-request error vs whole-call failure --------------------------------


def test_error_response_fails_only_its_request(load) -> None:
    backend = load("raiser")
    results = backend.execute(
        [
            _request("a", X=np.array([[1]], np.int32)),
            _request("b", X=np.array([[-1]], np.int32)),
            _request("c", X=np.array([[2], [3]], np.int32)),
        ]
    )
    assert _ok(results[0])["Y"].tolist() == [[1]]
    assert results[1] == InferError("INVALID_ARG", "negative input")
    assert _ok(results[2])["Y"].tolist() == [[2], [3]]


def test_exception_fails_every_request_of_the_call(load) -> None:
    backend = load("raiser")
    results = backend.execute(
        [
            _request("a", X=np.array([[1]], np.int32)),
            _request("b", X=np.array([[13]], np.int32)),
        ]
    )
    assert len(results) == 2
    for result in results:
        assert isinstance(result, InferError)
        assert result.code == "INTERNAL"
        assert "unlucky number 13" in result.message
        assert "raiser_0_0" in result.message
    # The instance keeps serving afterwards.
    assert _ok(backend.execute([_request(X=np.array([[5]], np.int32))])[0])["Y"].tolist() == [[5]]


# --- autocomplete --------------------------------------------------------------------


def test_auto_complete_config_fills_the_config() -> None:
    config = _context("autocomplete").config
    assert config.name == "autocomplete"
    assert config.max_batch_size == 4
    assert [(t.name, DataType.Name(t.data_type), list(t.dims)) for t in config.input] == [
        ("INPUT0", "TYPE_FP32", [2])
    ]
    assert [(t.name, DataType.Name(t.data_type), list(t.dims)) for t in config.output] == [
        ("OUTPUT0", "TYPE_FP32", [2])
    ]
    assert config.HasField("dynamic_batching")
    assert config.default_model_filename == "model.py"


def test_autocomplete_model_executes(load) -> None:
    backend = load("autocomplete")
    x = np.array([[1.5, -2]], np.float32)
    out = _ok(backend.execute([_request(INPUT0=x)])[0])
    np.testing.assert_array_equal(out["OUTPUT0"], np.array([[3, -4]], np.float32))


def test_auto_complete_conflicting_input_is_a_load_error(tmp_path: Path) -> None:
    _write_model(
        tmp_path,
        "clash",
        """
        backend: "python"
        input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 2 ] } ]
        """,
        """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]})
                return config

            def execute(self, requests):
                return []
        """,
    )
    with pytest.raises(ConfigError, match="configuration expects datatype TYPE_INT32"):
        _context("clash", tmp_path)


# --- slow: parameters, request id, sequence fields ----------------------------------


def test_slow_echoes_request_id_and_custom_parameters(load) -> None:
    backend = load("slow")
    params = {"sleep_ms": 1, "tag": "x", "sequence_id": 7, "sequence_start": True, "priority": 1}
    out = _ok(backend.execute([_request("q", params=params, IN=np.ones((2, 1), np.float32))])[0])
    np.testing.assert_array_equal(out["OUT"], np.ones((2, 1), np.float32))
    assert out["REQUEST_ID"].tolist() == [[b"client-q"], [b"client-q"]]
    assert json.loads(out["PARAMS"][0, 0]) == {"sleep_ms": 1, "tag": "x"}


# --- identity_bytes_all: every datatype, optional inputs ----------------------------

_ALL = {
    "BOOL": np.array([True, False]),
    "UINT8": np.array([0, 255], np.uint8),
    "INT8": np.array([-128, 127], np.int8),
    "INT16": np.array([-32768, 7], np.int16),
    "INT32": np.array([-(2**31), 9], np.int32),
    "INT64": np.array([-(2**63), 2**62], np.int64),
    "UINT16": np.array([65535, 1], np.uint16),
    "UINT32": np.array([2**32 - 1, 2], np.uint32),
    "UINT64": np.array([2**64 - 1, 3], np.uint64),
    "FP16": np.array([1.5, -0.25], np.float16),
    "FP32": np.array([3.25, np.inf], np.float32),
    "FP64": np.array([1e300, -0.0], np.float64),
    "BYTES": _bytes(b"a", b"\x00\xff"),
}


def test_identity_every_datatype(load) -> None:
    backend = load("identity_bytes_all")
    out = _ok(backend.execute([_request(**{f"IN_{t}": a for t, a in _ALL.items()})])[0])
    assert sorted(out) == sorted(f"OUT_{t}" for t in _ALL)
    for datatype, array in _ALL.items():
        got = out[f"OUT_{datatype}"]
        assert got.dtype == array.dtype, datatype
        assert got.tolist() == array.tolist(), datatype


def test_identity_returns_only_outputs_whose_input_came(load) -> None:
    backend = load("identity_bytes_all")
    out = _ok(backend.execute([_request(IN_INT8=_ALL["INT8"], IN_BYTES=_ALL["BYTES"])])[0])
    assert sorted(out) == ["OUT_BYTES", "OUT_INT8"]


# --- adapter rules with tiny models in tmp_path ---------------------------------------

_STRING_IO = """
    name: "{name}"
    backend: "python"
    max_batch_size: 4
    input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
    output [ {{ name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] }} ]
    {extra}
"""


def test_an_initialize_that_raises_fails_the_load_naming_the_exception_type(
    tmp_path: Path, load
) -> None:
    _write_model(
        tmp_path,
        "initfails",
        _STRING_IO.format(name="initfails", extra=""),
        """
        class TritonPythonModel:
            def initialize(self, args):
                raise KeyError("weights")

            def execute(self, requests):
                return []
        """,
    )
    with pytest.raises(RuntimeError) as info:
        load("initfails", tmp_path)
    assert str(info.value) == "KeyError: 'weights'"
    assert isinstance(info.value.__cause__, KeyError)


def test_initialize_args(tmp_path: Path, load) -> None:
    _write_model(
        tmp_path,
        "argsmodel",
        _STRING_IO.format(name="argsmodel", extra=""),
        """
        import triton_python_backend_utils as pb_utils
        SEEN = {}

        class TritonPythonModel:
            def initialize(self, args):
                SEEN.update(args)

            def execute(self, requests):
                return [pb_utils.InferenceResponse([]) for _ in requests]
        """,
    )
    backend = load("argsmodel", tmp_path)
    args = sys.modules[backend._model.__class__.__module__].SEEN
    assert set(args) == {
        "model_config",
        "model_instance_kind",
        "model_instance_name",
        "model_instance_device_id",
        "model_repository",
        "model_version",
        "model_name",
    }
    assert all(isinstance(v, str) for v in args.values())
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_name"] == "argsmodel_0_0"
    assert args["model_instance_device_id"] == "0"
    assert args["model_repository"] == str(tmp_path / "argsmodel")
    assert args["model_version"] == "1"
    assert args["model_name"] == "argsmodel"
    config = json.loads(args["model_config"])
    assert config["name"] == "argsmodel"
    assert config["max_batch_size"] == 4
    assert config["input"][0]["dims"] == [1]
    assert config["output"][0]["data_type"] == "TYPE_STRING"


def test_length_mismatch_fails_every_request(tmp_path: Path, load) -> None:
    _write_model(
        tmp_path,
        "short",
        _STRING_IO.format(name="short", extra=""),
        """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse(output_tensors=[])]
        """,
    )
    backend = load("short", tmp_path)
    x = np.zeros((1, 1), np.float32)
    results = backend.execute([_request("a", IN=x), _request("b", IN=x), _request("c", IN=x)])
    assert len(results) == 3
    for result in results:
        assert isinstance(result, InferError)
        assert result.code == "INTERNAL"
        assert "'short'" in result.message
        assert "(1)" in result.message and "(3)" in result.message


def test_str_and_numpy_string_outputs_become_bytes(tmp_path: Path, load) -> None:
    _write_model(
        tmp_path,
        "strings",
        _STRING_IO.format(name="strings", extra=""),
        """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                kinds = [np.array([["héllo"]], dtype=np.object_), np.array([[b"raw"]]),
                         np.array([["ünï"]])]
                return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", k)])
                        for k, _ in zip(kinds, requests)]
        """,
    )
    backend = load("strings", tmp_path)
    x = np.zeros((1, 1), np.float32)
    results = backend.execute([_request(str(i), IN=x) for i in range(3)])
    got = [_ok(r)["OUT"] for r in results]
    assert [g.dtype for g in got] == [np.dtype(object)] * 3
    assert [g.tolist() for g in got] == [[["héllo".encode()]], [[b"raw"]], [["ünï".encode()]]]


def test_execution_env_path_is_refused(tmp_path: Path) -> None:
    extra = 'parameters { key: "EXECUTION_ENV_PATH", value: { string_value: "env.tar.gz" } }'
    _write_model(
        tmp_path,
        "envmodel",
        _STRING_IO.format(name="envmodel", extra=extra),
        """
        class TritonPythonModel:
            def execute(self, requests):
                return []
        """,
    )
    with pytest.raises(ConfigError, match="EXECUTION_ENV_PATH is not supported by Sluice yet"):
        _context("envmodel", tmp_path)
    # Without auto-complete the load itself refuses it.
    loaded = load_model_config(ModelSource("envmodel", tmp_path / "envmodel", tmp_path))
    ctx = InstanceContext(
        "envmodel",
        1,
        loaded.config,
        "envmodel_0_0",
        "CPU",
        0,
        tmp_path / "envmodel",
        tmp_path / "envmodel" / "1",
    )
    with pytest.raises(RuntimeError, match="EXECUTION_ENV_PATH is not supported by Sluice yet"):
        PythonBackend().initialize(ctx)


def test_finalize_is_called(tmp_path: Path) -> None:
    _write_model(
        tmp_path,
        "fin",
        _STRING_IO.format(name="fin", extra=""),
        """
        import sys
        class TritonPythonModel:
            def execute(self, requests):
                return []
            def finalize(self):
                sys.modules[__name__].FINALIZED = True
        """,
    )
    backend = PythonBackend()
    backend.initialize(_context("fin", tmp_path))
    module = sys.modules[backend._model.__class__.__module__]
    backend.finalize()
    assert module.FINALIZED is True


# --- pb_utils itself -----------------------------------------------------------------


def test_pb_utils_types_and_helpers() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.triton_to_numpy_type(8) is np.int32
    tensor = pb_utils.Tensor("T", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert tensor.name() == "T"
    assert tensor.shape() == [2, 3]
    assert tensor.triton_dtype() == 11
    assert tensor.is_cpu()
    back = pb_utils.Tensor.from_dlpack("U", tensor.to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), tensor.as_numpy())
    error = pb_utils.TritonError("boom")
    assert error.code() == pb_utils.TritonError.INTERNAL and error.message() == "boom"
    request = pb_utils.InferenceRequest(
        model_name="m", inputs=[tensor], requested_output_names=["O"]
    )
    assert pb_utils.get_input_tensor_by_name(request, "T") is tensor
    assert request.is_cancelled() is False
    with pytest.raises(pb_utils.TritonModelException, match="BLS is not available"):
        request.exec()
    with pytest.raises(pb_utils.TritonModelException, match="decoupled"):
        request.get_response_sender()
    config = {
        "input": [{"name": "I"}],
        "output": [{"name": "O"}],
        "model_transaction_policy": {"decoupled": True},
    }
    assert pb_utils.get_input_config_by_name(config, "I") == {"name": "I"}
    assert pb_utils.get_output_config_by_name(config, "X") is None
    assert pb_utils.using_decoupled_model_transaction_policy(config) is True


def test_bls_hook_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def executor(request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        seen.append(request.model_name())
        return pb_utils.InferenceResponse([pb_utils.Tensor("O", np.ones(1, np.float32))])

    monkeypatch.setattr(bls, "executor", executor)
    response = pb_utils.InferenceRequest(
        model_name="other", inputs=[], requested_output_names=["O"]
    ).exec()
    assert seen == ["other"]
    assert pb_utils.get_output_tensor_by_name(response, "O").as_numpy().tolist() == [1.0]


def test_model_config_wrapper_rules() -> None:
    wrapper = pb_utils.ModelConfig(
        json.dumps({"name": "m", "max_batch_size": 8, "input": [], "output": []})
    )
    with pytest.raises(ValueError, match="configuration specified max_batch_size 8"):
        wrapper.set_max_batch_size(4)
    wrapper.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2], "optional": True})
    wrapper.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2]})
    with pytest.raises(ValueError, match="the model expects dims"):
        wrapper.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [3]})
    with pytest.raises(ValueError, match="contains property other than"):
        wrapper.add_output({"name": "O", "data_type": "TYPE_FP32", "dims": [2], "optional": True})
    wrapper.set_model_transaction_policy({"decoupled": False})
    with pytest.raises(ValueError, match="trying to change decoupled"):
        wrapper.set_model_transaction_policy({"decoupled": True})
    wrapper.set_dynamic_batching()
    assert wrapper.as_dict()["dynamic_batching"] == {}
    assert len(wrapper.as_dict()["input"]) == 1


def test_async_execute_sequence_fields_and_requested_outputs(tmp_path: Path, load) -> None:
    _write_model(
        tmp_path,
        "seq",
        _STRING_IO.format(name="seq", extra=""),
        """
        import json
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            async def execute(self, requests):
                out = []
                for r in requests:
                    info = json.dumps([r.correlation_id(), r.flags(),
                                       r.requested_output_names()]).encode()
                    out.append(pb_utils.InferenceResponse(
                        [pb_utils.Tensor("OUT", np.array([[info]], dtype=np.object_))]))
                return out
        """,
    )
    backend = load("seq", tmp_path)
    x = np.zeros((1, 1), np.float32)
    results = backend.execute(
        [
            _request("a", params={"sequence_id": 42, "sequence_start": True}, IN=x),
            _request("b", params={"sequence_id": "s-1", "sequence_end": True}, IN=x),
            _request("c", IN=x),
        ]
    )
    seen = [json.loads(_ok(r)["OUT"][0, 0]) for r in results]
    assert seen == [
        [42, pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, ["OUT"]],
        ["s-1", pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END, ["OUT"]],
        [0, 0, ["OUT"]],
    ]


# --- outputs whose dtype differs from the config ---------------------------------------


def test_an_output_converts_to_the_config_dtype_only_when_its_values_survive(
    load, tmp_path: Path
) -> None:
    """FP64 to FP32 rounds, as the config's type means; -1, 300 and 2.7 as UINT8, 2 as
    BOOL, 2**40 + 1 or 1e300 as FP32 would be other numbers: refused, naming model and
    output (they were converted silently to 255, 44, 2, True, 2**40 and inf)."""
    _write_model(
        tmp_path,
        "lossy",
        """
        backend: "python"
        max_batch_size: 0
        input [ { name: "CASE" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [
          { name: "F32" data_type: TYPE_FP32 dims: [ -1 ] },
          { name: "U8" data_type: TYPE_UINT8 dims: [ -1 ] },
          { name: "FLAG" data_type: TYPE_BOOL dims: [ -1 ] }
        ]
        """,
        """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        CASES = {
            0: (np.array([1.5, 2.7]), np.array([1.0, 200.0]), np.array([0, 1])),
            1: (np.array([2**40 + 1]), np.array([1.0]), np.array([1])),
            2: (np.array([1.0]), np.array([-1.0, 300.0, 2.7]), np.array([1])),
            3: (np.array([1.0]), np.array([1.0]), np.array([0, 2, -1], np.int32)),
            4: (np.array([1e300]), np.array([1.0]), np.array([1])),
        }

        class TritonPythonModel:
            def execute(self, requests):
                responses = []
                for request in requests:
                    case = int(pb_utils.get_input_tensor_by_name(request, "CASE").as_numpy()[0])
                    f32, u8, flag = CASES[case]
                    responses.append(pb_utils.InferenceResponse(output_tensors=[
                        pb_utils.Tensor("F32", f32), pb_utils.Tensor("U8", u8),
                        pb_utils.Tensor("FLAG", flag)]))
                return responses
        """,
    )
    backend = load("lossy", tmp_path)
    results = backend.execute(
        [_request(str(case), CASE=np.array([case], np.int32)) for case in range(5)]
    )
    out = _ok(results[0])
    assert out["F32"].dtype == np.float32
    assert out["F32"].tolist() == [1.5, np.float32(2.7)]
    assert (out["U8"].dtype, out["U8"].tolist()) == (np.uint8, [1, 200])
    assert (out["FLAG"].dtype, out["FLAG"].tolist()) == (np.bool_, [False, True])
    expected = {
        1: "output 'F32' is FP32 in the model configuration but the model returned int64",
        2: "output 'U8' is UINT8 in the model configuration but the model returned float64",
        3: "output 'FLAG' is BOOL in the model configuration but the model returned int32",
        4: "output 'F32' is FP32 in the model configuration but the model returned float64",
    }
    for case, text in expected.items():
        error = results[case]
        assert isinstance(error, InferError), (case, error)
        assert error.code == "INTERNAL"
        assert error.message == f"model 'lossy': {text} values that change when converted to it"
