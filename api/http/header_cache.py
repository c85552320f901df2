"""Parsed JSON headers of binary-tensor inference requests, by their bytes.

A client of the binary tensor data extension (``tritonclient``, perf_analyzer) sends
the same JSON header with every request of one shape: inputs' names, shapes,
datatypes and ``binary_data_size``, requested outputs, parameters; only the bytes
after it change. :class:`HeaderCache` keeps the :class:`BinaryLayout` of each header
it parsed, so a request whose header and body length match one is built without
parsing JSON, and, once one request of that header passed the model's checks
(:func:`broker.request_checks.validate_request`, which for non-``BYTES`` inputs reads only
what the header says), without checking it again against the same model view. A
header that lists a JSON ``data`` input, a request id (``"id"``) that changes each
time, or a body of another length is parsed in full. An input in client shared memory
counts as a binary input of 0 bytes (its bytes are read from its region for every
request: :mod:`api.shm_tensors`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sluice.api.http.infer_request import BinaryLayout, HttpInferRequest, parse_with_layout
from sluice.broker.request_checks import TensorSpec

__all__ = ["CachedHeader", "HeaderCache"]

#: headers kept at most; the cache starts again empty when full.
CAPACITY = 512
#: longest header kept, in bytes (a header with JSON data is never kept anyway).
MAX_HEADER_BYTES = 4096


class CachedHeader:
    """One kept header: its layout and the model view its requests passed the checks of.

    Attributes:
        layout: the header's :class:`BinaryLayout`.
        checked_view: the ``ModelView`` a request of this header passed
            ``validate_request`` against (None: not yet); its requests need no new check
            while the model's view is that same object.
        checkable: no input is ``BYTES`` (whose checks read the data, not only the header).
    """

    __slots__ = ("checkable", "checked_view", "layout")

    def __init__(self, layout: BinaryLayout) -> None:
        self.layout = layout
        self.checked_view: Any = None
        self.checkable = all(t.datatype != "BYTES" for t in layout.request.inputs)


class HeaderCache:
    """Headers of one gateway process (one event loop: no locking).

    Args:
        capacity: headers kept at most.
    """

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._headers: dict[bytes, CachedHeader] = {}

    def parse(
        self,
        body: bytes,
        header_length: int | None,
        *,
        model: str,
        config_inputs: Collection[TensorSpec] = (),
        max_batch_size: int = 0,
    ) -> tuple[HttpInferRequest, CachedHeader | None]:
        """Parse ``body`` as :func:`api.http.infer_request.parse_infer_request` does; the
        kept header of a binary-only request (None for any other).

        Raises:
            SluiceError: as ``parse_infer_request`` (a malformed body is never kept).
        """
        if header_length is None or not 0 < header_length <= min(len(body), MAX_HEADER_BYTES):
            return parse_with_layout(
                body,
                header_length,
                model=model,
                config_inputs=config_inputs,
                max_batch_size=max_batch_size,
            )[0], None
        key = body[:header_length]
        kept = self._headers.get(key)
        if kept is not None and kept.layout.body_length == len(body):
            return kept.layout.apply(body), kept
        request, layout = parse_with_layout(body, header_length, model=model)
        if layout is None:
            return request, None
        if len(self._headers) >= self._capacity:
            self._headers.clear()
        kept = self._headers[key] = CachedHeader(layout)
        return request, kept
