"""sluice.api.http.header_cache: binary-request headers parsed once, by their bytes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e_support import tritonclient_body

from sluice.api.http.header_cache import HeaderCache
from sluice.api.http.infer_request import parse_infer_request
from sluice.broker.errors import SluiceError

MODEL = "m"


def _body(
    arrays: dict[str, tuple[np.ndarray, str, bool]], **kwargs: Any
) -> tuple[bytes, int | None]:
    """A request body exactly as tritonclient.http builds it, asking for OUT in binary."""
    outputs = [httpclient.InferRequestedOutput("OUT", binary_data=True)]
    return tritonclient_body(arrays, outputs, **kwargs)


def _fp32(value: float, rows: int = 2) -> np.ndarray:
    return np.full((rows, 4), value, np.float32)


def test_a_second_request_of_a_header_is_built_from_the_kept_layout() -> None:
    cache = HeaderCache()
    first, length = _body({"A": (_fp32(1.0), "FP32", True), "B": (_fp32(2.0), "FP32", True)})
    second, length2 = _body({"A": (_fp32(3.0), "FP32", True), "B": (_fp32(4.0), "FP32", True)})
    assert length == length2 and first[:length] == second[:length]

    parsed1, kept1 = cache.parse(first, length, model=MODEL)
    parsed2, kept2 = cache.parse(second, length, model=MODEL)

    assert kept1 is not None and kept2 is kept1 and kept1.checkable
    assert parsed1 == parse_infer_request(first, length, model=MODEL)
    assert parsed2 == parse_infer_request(second, length, model=MODEL)
    assert [t.data for t in parsed2.inputs] == [_fp32(3.0).tobytes(), _fp32(4.0).tobytes()]
    assert parsed2.outputs[0].name == "OUT" and parsed2.outputs[0].binary


def test_parameters_are_not_shared_between_requests() -> None:
    cache = HeaderCache()
    body, length = _body({"A": (_fp32(1.0), "FP32", True)}, priority=2, timeout=5000)
    parsed1, _ = cache.parse(body, length, model=MODEL)
    parsed2, kept = cache.parse(body, length, model=MODEL)
    assert kept is not None
    assert parsed2.parameters == {"priority": 2, "timeout": 5000}
    parsed2.parameters["priority"] = 9
    assert parsed1.parameters["priority"] == 2
    assert cache.parse(body, length, model=MODEL)[0].parameters["priority"] == 2


@pytest.mark.parametrize("delta", [-1, 1, 16])
def test_a_body_of_another_length_gets_the_full_parse_and_its_error(delta: int) -> None:
    cache = HeaderCache()
    body, length = _body({"A": (_fp32(1.0), "FP32", True)})
    cache.parse(body, length, model=MODEL)
    other = body[:delta] if delta < 0 else body + b"\0" * delta
    with pytest.raises(SluiceError) as cached:
        cache.parse(other, length, model=MODEL)
    with pytest.raises(SluiceError) as plain:
        parse_infer_request(other, length, model=MODEL)
    assert cached.value.message == plain.value.message
    assert cached.value.code == plain.value.code


def test_json_data_and_raw_requests_are_not_kept() -> None:
    cache = HeaderCache()
    body, length = _body({"A": (_fp32(1.0), "FP32", True), "J": (_fp32(2.0), "FP32", False)})
    parsed, kept = cache.parse(body, length, model=MODEL)
    assert kept is None
    assert parsed == parse_infer_request(body, length, model=MODEL)
    json_only, none_length = _body({"J": (_fp32(2.0), "FP32", False)})
    assert none_length is None
    assert cache.parse(json_only, none_length, model=MODEL)[1] is None


def test_a_bytes_input_is_kept_but_never_marked_checkable() -> None:
    cache = HeaderCache()
    words = np.array([[b"ab"], [b"c"]], dtype=object)
    body, length = _body({"S": (words, "BYTES", True)})
    _, kept = cache.parse(body, length, model=MODEL)
    assert kept is not None and not kept.checkable


def test_the_cache_starts_again_when_full() -> None:
    cache = HeaderCache(capacity=2)
    bodies = [_body({"A": (_fp32(1.0, rows), "FP32", True)}) for rows in (1, 2, 3)]
    kept = [cache.parse(b, n, model=MODEL)[1] for b, n in bodies]
    assert cache.parse(*bodies[1], model=MODEL)[1] is not kept[1]  # cleared at the third
    assert cache.parse(*bodies[2], model=MODEL)[1] is kept[2]
    assert len(cache._headers) == 2


def test_a_request_id_makes_each_header_its_own() -> None:
    cache = HeaderCache()
    a, length_a = _body({"A": (_fp32(1.0), "FP32", True)}, request_id="r1")
    b, length_b = _body({"A": (_fp32(1.0), "FP32", True)}, request_id="r2")
    parsed_a, kept_a = cache.parse(a, length_a, model=MODEL)
    parsed_b, kept_b = cache.parse(b, length_b, model=MODEL)
    assert (parsed_a.client_id, parsed_b.client_id) == ("r1", "r2")
    assert kept_a is not kept_b
