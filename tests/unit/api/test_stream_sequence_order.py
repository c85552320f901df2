"""``ModelStreamInfer`` queues the steps of one sequence in the order they arrived, even
when an earlier step waits longer on its way (a model view read from Redis) than a later
one (a cached view): the sequence batcher refuses a step that overtakes its START."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from tritonclient.grpc import service_pb2

from sluice.api.grpc.streaming import stream_infer


class _View:
    decoupled = False


class _Submission:
    """Every model view is cached: requests reach ``unary`` in arrival order."""

    async def resolve_for_infer(self, model: str, version: int | None) -> tuple[_View, int]:
        return _View(), 1


class _Context:
    def set_code(self, code: Any) -> None:
        pass

    def set_details(self, details: str) -> None:
        pass


def _request(sid: int | str, k: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="seq", id=f"{sid}-{k}")
    if isinstance(sid, str):
        request.parameters["sequence_id"].string_param = sid
    else:
        request.parameters["sequence_id"].int64_param = sid
    request.parameters["sequence_start"].bool_param = k == 0
    return request


async def _run(requests: list[service_pb2.ModelInferRequest]) -> tuple[list[str], list[str]]:
    queued: list[str] = []

    async def unary(
        request: service_pb2.ModelInferRequest, on_queued: Callable[[], None]
    ) -> service_pb2.ModelInferResponse:
        step = int(request.id.rsplit("-", 1)[1])
        # the first step of a sequence waits (a view read), the others go at once
        await asyncio.sleep(0.05 if step == 0 else 0)
        queued.append(request.id)
        on_queued()
        await asyncio.sleep(0.01)
        return service_pb2.ModelInferResponse(model_name="seq", id=request.id)

    async def incoming() -> AsyncIterator[service_pb2.ModelInferRequest]:
        for request in requests:
            yield request
            await asyncio.sleep(0)

    answered = [
        answer.infer_response.id
        async for answer in stream_infer(
            _Submission(),  # type: ignore[arg-type]
            unary,
            incoming(),
            _Context(),  # type: ignore[arg-type]
            lambda callback: lambda: None,
        )
    ]
    return queued, answered


@pytest.mark.parametrize("ids", [(201, 202), ("a", "b")])
def test_steps_of_a_sequence_are_queued_in_arrival_order(ids: tuple[Any, Any]) -> None:
    requests = [_request(sid, k) for k in range(4) for sid in ids]
    queued, answered = asyncio.run(_run(requests))
    assert answered == [r.id for r in requests]
    for sid in ids:
        assert [q for q in queued if q.startswith(f"{sid}-")] == [f"{sid}-{k}" for k in range(4)]


def test_requests_outside_sequences_are_not_held_back() -> None:
    """Requests without a ``sequence_id`` run concurrently: a slow first one does not
    keep the later ones from being queued (only their answers keep request order)."""
    requests = [service_pb2.ModelInferRequest(model_name="m", id=f"x-{k}") for k in range(3)]
    queued, answered = asyncio.run(_run(requests))
    assert queued == ["x-1", "x-2", "x-0"]
    assert answered == ["x-0", "x-1", "x-2"]
