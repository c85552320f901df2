"""A decoupled model's response sender against a real Redis: it stays within the credit
window of what the client took, and a cancelled request drops what is sent after."""

from __future__ import annotations

import threading
import time

import numpy as np
import redis

from sluice.broker.codec import decode_response
from sluice.broker.keys import KeySchema
from sluice.broker.response_stream import CANCELLED_CREDIT, CREDIT_WINDOW
from sluice.gpu_workers.answers import Answers
from sluice.gpu_workers.backends.base import InferResponse
from sluice.gpu_workers.backends.python import pb_utils
from sluice.gpu_workers.backends.python.decoupled import ResponsePump, make_converter


def _convert(response: pb_utils.InferenceResponse) -> InferResponse:
    return InferResponse({t.name(): t.as_numpy() for t in response.output_tensors()})


def _until(predicate, timeout_s: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_the_sender_waits_for_credit_and_stops_when_cancelled(
    redis_url: str, key_prefix: str
) -> None:
    keys = KeySchema(key_prefix)
    client = redis.Redis.from_url(redis_url)
    answers = Answers("m", 1, "", {"OUT": "INT32"}, batching=False)
    pump = ResponsePump(redis.Redis.from_url(redis_url), keys, answers, "m_0_0")
    reply_to = keys.reply("gw-test")
    deadline_ns = time.time_ns() + 30 * 10**9
    sender = pump.sender("r1", reply_to, deadline_ns, make_converter(pump, _convert))
    sent: list[int] = []

    def produce() -> None:
        for i in range(500):
            out = pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
            sent.append(i)
            if sender.is_cancelled():
                break
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        # nobody has taken anything: the producer stops at the window, and so does Redis
        assert _until(lambda: client.llen(reply_to) == CREDIT_WINDOW)
        time.sleep(0.3)
        assert len(sent) == CREDIT_WINDOW and client.llen(reply_to) == CREDIT_WINDOW
        # the client took 100: 100 + the window may be out
        client.set(keys.stream_credit("r1"), 100)
        assert _until(lambda: client.llen(reply_to) == 100 + CREDIT_WINDOW)
        time.sleep(0.3)
        assert len(sent) == 100 + CREDIT_WINDOW
        # the client cancelled: the model sees it, and nothing more is pushed
        client.set(keys.stream_credit("r1"), CANCELLED_CREDIT)
        producer.join(5)
        assert not producer.is_alive()
        assert sender.is_cancelled()
        assert len(sent) == 100 + CREDIT_WINDOW + 1  # the send that was waiting, dropped
        payloads = client.lrange(reply_to, 0, -1)
        assert len(payloads) == 100 + CREDIT_WINDOW
        messages = [decode_response(p) for p in payloads]
        assert [int(np.frombuffer(m.outputs[0].data, np.int32)[0]) for m in messages] == list(
            range(100 + CREDIT_WINDOW)
        )
        assert not any(m.final for m in messages)
        assert {m.instance.split("@")[0] for m in messages} == {"m_0_0"}
    finally:
        producer.join(5)
        pump.stop()
        client.close()
