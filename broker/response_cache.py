"""The response cache (Triton ``response_cache { enable: true }`` with ``--cache-config``).

Triton keeps one cache per server process (``--cache-config local,size=<bytes>``).
Sluice keeps it in Redis, so every gateway of a deployment shares it: a response
computed behind one gateway answers the same request sent to any other. Rules
(docs/reference/model-configuration.md, response cache; Triton ``response_cache.md``):

* Key: a digest of the model name, version and every input's name, datatype, shape
  and bytes (:func:`request_digest`; Sluice adds the requested output names and
  classification counts, which change what the answer holds, and the id of the model's
  load, so that a reload or a restart never serves an older model's answers).
* Only successful responses are stored; a hit returns the stored outputs under the
  request's own id without running the model.
* The cache holds at most ``size`` bytes of encoded responses; the least recently used
  entries are evicted to make room (:data:`CACHE_INSERT`), and a response larger than
  the whole cache is not stored.

Keys (``KeySchema``): ``<prefix>{cache}:e:<digest>`` (the encoded response),
``<prefix>{cache}:lru`` (sorted set: entry key -> last use, ms) and ``<prefix>{cache}:bytes``
(bytes held). They share the hash tag ``{cache}``: on a Redis Cluster the whole cache
lives in one slot, so the insert script, which touches the entries it evicts without
declaring them, reaches them on its own node.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence

from sluice.broker.messages import WireTensor
from sluice.broker.scripts import Script

__all__ = ["CACHE_INSERT", "CACHE_LOOKUP", "parse_cache_config", "request_digest"]

#: Store one response, evicting the least recently used ones to stay within the size.
#: KEYS[1]: entry, KEYS[2]: LRU sorted set, KEYS[3]: bytes counter.
#: ARGV: encoded response, size limit (bytes), now (ms).
#: Returns the number of entries evicted, or -1 when the response alone is too large.
CACHE_INSERT = Script(
    """
local size = string.len(ARGV[1])
local limit = tonumber(ARGV[2])
if size > limit then return -1 end
local old = redis.call('STRLEN', KEYS[1])
if old > 0 then
  redis.call('DECRBY', KEYS[3], old)
  redis.call('ZREM', KEYS[2], KEYS[1])
end
local held = tonumber(redis.call('GET', KEYS[3]) or '0')
local evicted = 0
while held + size > limit do
  local oldest = redis.call('ZPOPMIN', KEYS[2])
  if #oldest == 0 then held = 0; redis.call('SET', KEYS[3], 0); break end
  local bytes = redis.call('STRLEN', oldest[1])
  redis.call('DEL', oldest[1])
  held = held - bytes
  redis.call('DECRBY', KEYS[3], bytes)
  evicted = evicted + 1
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], tonumber(ARGV[3]), KEYS[1])
redis.call('INCRBY', KEYS[3], size)
return evicted
"""
)

#: Look one response up and mark it used. KEYS[1]: entry, KEYS[2]: LRU sorted set.
#: ARGV: now (ms). Returns the encoded response or nil.
CACHE_LOOKUP = Script(
    """
local found = redis.call('GET', KEYS[1])
if found then redis.call('ZADD', KEYS[2], 'XX', tonumber(ARGV[1]), KEYS[1]) end
return found
"""
)


def request_digest(
    model: str,
    version: int,
    load_id: str,
    inputs: Iterable[WireTensor],
    outputs: Sequence[str],
    classification: Mapping[str, int],
) -> str:
    """The cache key of a request: BLAKE2b (32 hex digits) of the model name, version,
    the load that serves it (``VersionState.load_id``: answers of an older load of the
    model, before a reload or a restart, are never served), each input's name,
    datatype, shape and bytes (in name order), the requested output names and
    classification counts. Inputs that differ in any byte, shape or datatype get
    different keys."""
    digest = hashlib.blake2b(digest_size=16)

    def text(value: str) -> None:
        raw = value.encode()
        digest.update(struct.pack("<I", len(raw)))
        digest.update(raw)

    text(model)
    digest.update(struct.pack("<q", version))
    text(load_id)
    for tensor in sorted(inputs, key=lambda t: t.name):
        text(tensor.name)
        text(tensor.datatype)
        digest.update(struct.pack(f"<I{len(tensor.shape)}q", len(tensor.shape), *tensor.shape))
        data = memoryview(tensor.data).cast("B")  # hashed in place, not copied
        digest.update(struct.pack("<Q", data.nbytes))
        digest.update(data)
    digest.update(struct.pack("<I", len(outputs)))
    for name in outputs:
        text(name)
        digest.update(struct.pack("<i", int(classification.get(name, 0))))
    return digest.hexdigest()


def parse_cache_config(values: Sequence[str]) -> int:
    """The cache size in bytes from Triton's ``--cache-config`` values.

    Triton takes ``<cache>,<key>=<value>`` (repeatable); Sluice serves the ``local``
    cache's ``size`` (bytes, > 0), kept in Redis. ``local,size=0`` (or no flag) is off.

    Raises:
        ValueError: another cache implementation, another key, or a size that is not
            a non-negative integer; the message names the value.
    """
    size = 0
    for value in values:
        cache, sep, setting = value.partition(",")
        if cache != "local":
            raise ValueError(
                f"'{value}': only the 'local' cache is served (Sluice keeps "
                "it in Redis, shared by every gateway)"
            )
        key, eq, number = setting.partition("=")
        if not sep or not eq or key != "size" or "," in number:
            raise ValueError(f"'{value}': expected local,size=<bytes> (size is the only setting)")
        if number.startswith("-") and number[1:].isdigit():
            raise ValueError(f"'{value}': size must be >= 0")
        if not (number.isascii() and number.isdigit()):
            raise ValueError(f"'{value}': size must be a whole number of bytes")
        size = int(number)
    return size
