"""Lua scripts Sluice runs in Redis: those of the gateways' request path addressed by SHA1
(``EVALSHA``, loaded again on ``NOSCRIPT``), the rare ones sent whole (``EVAL``).

Each script touches the keys of one hash slot only (one model's keys share the
hash tag ``{model}``; a reply list is a key of its own), so they also run on a
Redis Cluster.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script and its SHA1 digest (what ``SCRIPT LOAD`` returns)."""

    body: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.body.encode()).hexdigest())

    def command(self, keys: list[str], args: list[object]) -> tuple[object, ...]:
        """The ``EVALSHA`` command calling this script with ``keys`` and ``args``."""
        return ("EVALSHA", self.sha, len(keys), *keys, *args)


#: ``max_queue_size`` (Triton ``ModelQueuePolicy``) enforced at ``XADD`` time: refused (0)
#: when the stream already holds that many entries no instance has taken yet (stream
#: length minus the consumer group's pending count); otherwise returns the new entry's id,
#: as ``XADD`` does. KEYS[1]: stream; ARGV: max, group, encoded request.
BOUNDED_XADD = Script(
    """
local max = tonumber(ARGV[1])
local len = redis.call('XLEN', KEYS[1])
if len >= max then
  local ok, pending = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[2])
  local taken = 0
  if ok and pending then taken = pending[1] end
  if len - taken >= max then return 0 end
end
return redis.call('XADD', KEYS[1], '*', 'm', ARGV[3])
"""
)

#: Take a cancelled request off its stream and count it, at once, if no instance has taken
#: it yet (Triton: a request cancelled while in the scheduler queue is not executed and
#: counts as a failure, reason CANCELED). Returns 1 when it did, 0 when the entry is in the
#: consumer group's pending list (an instance holds it: it runs) or no longer on the stream.
#: Deleting a not-taken entry keeps ``BOUNDED_XADD``'s count (length minus pending) right.
#: KEYS[1]: stream; KEYS[2]: the version's statistics hash.
#: ARGV[1]: consumer group; ARGV[2]: entry id; ARGV[3]: the counter increments as one
#: string "field delta field delta ..." (``StatsDelta.counter_text``).
CANCEL_QUEUED = Script(
    """
local ok, pending = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if ok and pending[1] then return 0 end
if redis.call('XDEL', KEYS[1], ARGV[2]) == 0 then return 0 end
for name, delta in string.gmatch(ARGV[3], '(%S+) (%S+)') do
  redis.call('HINCRBY', KEYS[2], name, delta)
end
return 1
"""
)

#: Fold a model instance's statistics shard into the version's gateway hash, at once (the
#: instance stopped; readers never see its counts twice or not at all): every field added
#: (``last_inference_ms``: the later one kept), the shard deleted and taken off the list.
#: KEYS[1]: the version's statistics hash; KEYS[2]: the shard; KEYS[3]: the shard list.
#: Returns the number of fields folded (0: no such shard). Sent whole (``EVAL``): it runs
#: when instances stop.
FOLD_STATS = Script(
    """
local fields = redis.call('HGETALL', KEYS[2])
for i = 1, #fields, 2 do
  local name, value = fields[i], fields[i + 1]
  if name == 'last_inference_ms' then
    local current = tonumber(redis.call('HGET', KEYS[1], name) or '0')
    if tonumber(value) > current then redis.call('HSET', KEYS[1], name, value) end
  else
    redis.call('HINCRBY', KEYS[1], name, value)
  end
end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], KEYS[2])
return #fields / 2
"""
)

#: Read a version's statistics at once: the gateway hash, then every listed instance
#: shard (in one script, so that a shard folded meanwhile is seen once: in its shard or in
#: the gateway hash, never in neither). The shards share the version's hash slot.
#: KEYS[1]: the version's statistics hash; KEYS[2]: the shard list.
#: Returns a list of HGETALL replies, the gateway hash's first. Sent whole (``EVAL``,
#: which Redis caches by digest): a statistics read or scrape, not the request path.
READ_STATS = Script(
    """
local out = {redis.call('HGETALL', KEYS[1])}
for _, shard in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  out[#out + 1] = redis.call('HGETALL', shard)
end
return out
"""
)
