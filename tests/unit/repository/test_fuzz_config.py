"""Property tests of the ``config.pbtxt`` loader (``sluice.repository``): any text, and
any config built of the fields users write, is loaded or refused with a
:class:`RepositoryError`; a config written as text or as Triton's JSON reads back equal.

``SLUICE_FUZZ_EXAMPLES`` sets the examples per test (300 by default, see
``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.repository.config import parse_config_text
from sluice.repository.errors import RepositoryError
from sluice.repository.loader import load_model_config
from sluice.repository.render import config_from_json, config_to_json
from sluice.repository.scan import ModelSource

FUZZ = settings(settings.get_profile("fuzz"))
DATA_TYPES = ["TYPE_FP32", "TYPE_INT64", "TYPE_STRING", "TYPE_BOOL", "TYPE_FP16", "TYPE_INVALID"]
DIMS = st.lists(st.integers(-3, 4), max_size=3)


@st.composite
def tensors(draw: st.DrawFn) -> dict:
    tensor: dict = {
        "name": draw(st.sampled_from(["IN", "OUT", "X", ""])),
        "data_type": draw(st.sampled_from(DATA_TYPES)),
        "dims": draw(DIMS),
    }
    if draw(st.booleans()):
        tensor["reshape"] = {"shape": draw(DIMS)}
    return tensor


@st.composite
def configs(draw: st.DrawFn) -> ModelConfig:
    """A config of the fields users write, each present or not, valid values or not."""
    optional = {
        "name": st.sampled_from(["m", "other", ""]),
        "platform": st.sampled_from(["onnxruntime_onnx", "ensemble", "pytorch_libtorch", "x"]),
        "backend": st.sampled_from(["onnxruntime", "python", "pytorch", "x"]),
        "max_batch_size": st.integers(-2, 64),
        "input": st.lists(tensors(), max_size=3),
        "output": st.lists(tensors(), max_size=3),
        "instance_group": st.lists(
            st.fixed_dictionaries(
                {"count": st.integers(-1, 3),
                 "kind": st.sampled_from(["KIND_CPU", "KIND_GPU", "KIND_AUTO", "KIND_MODEL"])},
                optional={"gpus": st.lists(st.integers(-1, 2), max_size=2)},
            ),
            max_size=2,
        ),
        "dynamic_batching": st.fixed_dictionaries(
            {},
            optional={
                "max_queue_delay_microseconds": st.integers(0, 10**6),
                "preferred_batch_size": st.lists(st.integers(-1, 70), max_size=3),
                "priority_levels": st.integers(0, 3),
                "default_priority_level": st.integers(0, 4),
                "default_queue_policy": st.fixed_dictionaries(
                    {}, optional={"timeout_action": st.sampled_from(["REJECT", "DELAY"]),
                                  "max_queue_size": st.integers(0, 5)},
                ),
            },
        ),
        "version_policy": st.sampled_from(
            [{"all": {}}, {"latest": {"num_versions": 0}}, {"latest": {"num_versions": 2}},
             {"specific": {"versions": [1, 3]}}, {"specific": {"versions": [-1]}}]
        ),
        "model_warmup": st.lists(
            st.fixed_dictionaries({"name": st.just("w"), "batch_size": st.integers(0, 4)}),
            max_size=1,
        ),
    }  # fmt: skip
    chosen = draw(st.sets(st.sampled_from(list(optional))))
    config = config_from_json({key: draw(optional[key]) for key in chosen})
    return config


@FUZZ
@given(st.text(max_size=200))
def test_any_text_parses_or_is_refused_with_a_config_error(text: str) -> None:
    with contextlib.suppress(RepositoryError):
        parse_config_text(text, model="m")


@FUZZ
@given(
    st.lists(
        st.sampled_from(
            ["name:", '"m"', "max_batch_size:", "-1", "8", "input", "[", "]", "{", "}",
             "dims:", "data_type:", "TYPE_FP32", "instance_group", "kind:", "KIND_CPU",
             ",", "#", "\n", "dynamic_batching", "parameters", "key:", "value:",
             "string_value:", "1e99", "0x1f", "\"\\x\"", "version_policy:", "latest", ":"]
        ),
        max_size=30,
    ).map(" ".join)
)  # fmt: skip
def test_text_of_config_words_parses_or_is_refused(text: str) -> None:
    """Tokens of the format in any order: the parser's own errors become ConfigError."""
    with contextlib.suppress(RepositoryError):
        parse_config_text(text, model="m")


@FUZZ
@given(configs())
def test_a_config_written_as_text_reads_back_equal(config: ModelConfig) -> None:
    assert parse_config_text(text_format.MessageToString(config)) == config


@FUZZ
@given(configs())
def test_a_config_rendered_as_triton_json_reads_back_equal(config: ModelConfig) -> None:
    assert config_from_json(config_to_json(config)) == config


@FUZZ
@given(configs(), st.booleans())
def test_any_config_loads_or_is_refused_with_a_repository_error(
    config: ModelConfig, strict: bool
) -> None:
    """The whole loader (backend, normalization, validation, versions) on a model folder
    holding the config, versions 1 and 2 and an empty model file."""
    with tempfile.TemporaryDirectory() as folder:
        model_dir = Path(folder) / "m"
        for version in ("1", "2"):
            (model_dir / version).mkdir(parents=True)
            (model_dir / version / "model.onnx").write_bytes(b"")
        (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
        source = ModelSource("m", model_dir, Path(folder))
        try:
            loaded = load_model_config(source, strict=strict)
        except RepositoryError:
            return
        assert loaded.config.name == "m"
        assert set(loaded.versions) <= {1, 2}
