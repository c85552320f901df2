"""``benchmarks/loop_cost.py``: one batch goes through the real instance loop."""

from __future__ import annotations

import hiredis
import numpy as np
from e2e_support import load_module

from sluice.broker.codec import decode_response


def test_a_batch_is_answered_and_acknowledged() -> None:
    module = load_module("benchmarks/loop_cost.py", "loop_cost")
    one = module._harness(4, 2)  # type: ignore[attr-defined]
    reader = hiredis.Reader()
    reader.feed(one(0))
    commands = []
    while (command := reader.gets()) is not False:
        commands.append(command)
    by_name = {c[0]: c for c in commands}
    rpush = by_name[b"RPUSH"]
    assert rpush[1] == b"loopcost:reply:gw" and len(rpush) == 2 + 4
    answers = [decode_response(p) for p in rpush[2:]]
    assert [a.request_id for a in answers] == [f"gw-0-{i}" for i in range(4)]
    (output,) = answers[0].outputs
    assert (output.name, output.datatype, output.shape) == ("OUTPUT0", "FP32", (1, 10))
    np.testing.assert_array_equal(np.frombuffer(output.data, np.float32), np.zeros(10))
    assert by_name[b"XACK"][3:] == [b"0-0", b"0-1", b"0-2", b"0-3"]
    assert commands[-1][0] == b"XREADGROUP"
