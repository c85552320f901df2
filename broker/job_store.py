"""Async jobs in Redis: records, requests, results, bulk rows, leases and counters.

The gateway creates a job (:meth:`JobStore.create`) and the job worker that runs it
updates it. What must happen once happens in one script: a state change is a
compare-and-set on the record (:meth:`JobStore.transition`), so a job reaches a final
state once however many workers race; a bulk row's line is written only if neither of
the job's row hashes holds that row yet and the job has not reached a final state
(:meth:`JobStore.write_rows`), so each row appears once in the output or the errors and
a cancelled job's rows and counts stay as they were when it was cancelled. A job's keys
share the hash tag of its id, so each script touches one hash slot (docs/architecture.md,
Redis keys).

Expiry: a job's keys expire ``ttl_s`` after its deadline until it finishes, then
``ttl_s`` after it finished; an expired or unknown id reads as None (404 to clients).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import redis.asyncio
import redis.exceptions

from sluice.broker.job_records import JobKind, JobRecord
from sluice.broker.keys import KeySchema
from sluice.broker.states import JOB_TRANSITIONS, JobState

__all__ = ["JobStore", "stats_field"]

#: Compare-and-set of a job's state. KEYS[1]: the record; KEYS[2..]: keys to expire
#: with it. ARGV[1]: the allowed current states as ",A,B,"; ARGV[2]: the new state;
#: ARGV[3]: seconds until every key expires (0: leave the expiry); ARGV[4..]: more
#: field/value pairs. Returns {1, previous} when it changed the state, {0, current}
#: when the state was not an allowed one, nil when the record is gone.
_TRANSITION = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return nil end
if not string.find(ARGV[1], ',' .. state .. ',', 1, true) then return {0, state} end
redis.call('HSET', KEYS[1], 'state', ARGV[2], unpack(ARGV, 4))
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
end
return {1, state}
"""

#: Write bulk rows once each, while the job runs. KEYS[1]: output hash; KEYS[2]: errors
#: hash; KEYS[3]: the job's record. ARGV[1]: the Unix time both hashes expire at; ARGV[2]:
#: the final states as ",A,B,"; then (hash index 1|2, line number, JSON line) triples. A
#: row either hash already holds is left as it is. Returns {new outputs, new errors}, or
#: nil (nothing written) when the record is gone or its state is a final one.
_WRITE_ROWS = """
local state = redis.call('HGET', KEYS[3], 'state')
if not state or string.find(ARGV[2], ',' .. state .. ',', 1, true) then return nil end
local written = {0, 0}
for i = 3, #ARGV, 3 do
  local row = ARGV[i + 1]
  if redis.call('HEXISTS', KEYS[1], row) == 0 and redis.call('HEXISTS', KEYS[2], row) == 0 then
    local which = tonumber(ARGV[i])
    redis.call('HSET', KEYS[which], row, ARGV[i + 2])
    written[which] = written[which] + 1
  end
end
for i = 1, 2 do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('EXPIREAT', KEYS[i], ARGV[1]) end
end
return written
"""

#: Renew (ARGV[2] ms) or, with ARGV[2] = 0, release the lease KEYS[1] if it is still
#: ARGV[1]'s. Returns 1 when it was.
_LEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > 0 then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return redis.call('DEL', KEYS[1])
"""

#: the most index entries one listing reads, newest first.
_LIST_SCAN = 5000


def stats_field(event: str, kind: JobKind | str, model: str) -> str:
    """The ``jobs_stats`` field of one counter: ``<event>\\t<kind>\\t<model>``."""
    return f"{event}\t{kind}\t{model}"


def _expire_at_s(record: JobRecord) -> int:
    """When a running job's keys expire: ``ttl_s`` after its deadline, Unix s."""
    return record.deadline_ns // 1_000_000_000 + max(1, record.ttl_s)


class JobStore:
    """Reads and writes jobs of one deployment.

    Args:
        client: an asyncio Redis client (RESP2, bytes replies).
        keys: the deployment's key schema.
    """

    def __init__(self, client: redis.asyncio.Redis, keys: KeySchema) -> None:
        self._redis = client
        self.keys = keys
        self._transition = client.register_script(_TRANSITION)
        self._write_rows = client.register_script(_WRITE_ROWS)
        self._lease = client.register_script(_LEASE)

    # -- records ------------------------------------------------------------------------

    async def create(self, record: JobRecord, payload: bytes, keep_index_s: int = 0) -> None:
        """Store a new job's record and input (a single job's encoded request or a bulk
        job's body; ``b""``: none), index it and count it submitted. ``keep_index_s``:
        the longest a job can live (its deadline and the longest TTL), in s; index
        entries older than that are dropped (0: none are).

        Raises:
            redis.exceptions.RedisError: Redis unreachable.
        """
        keys = self.keys
        expire_at = _expire_at_s(record)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(keys.job(record.id), mapping=record.to_fields())  # type: ignore[arg-type]
            pipe.expireat(keys.job(record.id), expire_at)
            if payload:
                pipe.set(keys.job_input(record.id), payload, exat=expire_at)
            created_ms = record.created_ns // 1_000_000
            pipe.zadd(keys.jobs_index(), {record.id: created_ms})
            if keep_index_s > 0:
                pipe.zremrangebyscore(keys.jobs_index(), "-inf", created_ms - keep_index_s * 1000)
            pipe.sadd(keys.jobs_active(), record.id)
            pipe.hincrby(keys.jobs_stats(), stats_field("submitted", record.kind, record.model))
            await pipe.execute()

    async def get(self, job_id: str) -> JobRecord | None:
        """The job's record; None for an unknown or expired id (or a broken record)."""
        raw = await self._redis.hgetall(self.keys.job(job_id))
        if not raw:
            return None
        try:
            return JobRecord.from_fields(job_id, raw)
        except ValueError:
            return None

    async def transition(
        self,
        record: JobRecord,
        to: JobState,
        **changes: object,
    ) -> bool:
        """Move ``record``'s job to ``to`` if its state in Redis allows it
        (:data:`~sluice.broker.states.JOB_TRANSITIONS`), setting ``changes`` (record
        fields) with it; ``record`` is updated to match. A final state sets
        ``finished_ns``, expires every key of the job ``ttl_s`` from now and counts it.

        Returns:
            True when this call changed the state; False when the job is gone or its
            state did not allow it (another worker, or a cancellation, came first).

        Raises:
            redis.exceptions.RedisError: Redis unreachable.
        """
        allowed = [s for s, targets in JOB_TRANSITIONS.items() if to in targets]
        now_ns = time.time_ns()
        if to.final:
            changes.setdefault("finished_ns", now_ns)
        elif to is JobState.STARTED and not record.started_ns:
            changes.setdefault("started_ns", now_ns)
        pairs: list[object] = []
        for name, value in changes.items():
            pairs += [name, "" if value is None else str(value)]
        ttl = max(1, record.ttl_s) if to.final else 0
        keys = self.keys.job_keys(record.id)
        reply = await self._transition(
            keys=keys, args=["," + ",".join(allowed) + ",", to.value, ttl, *pairs]
        )
        if reply is None or not int(reply[0]):
            if reply is not None:
                record.state = JobState(_text(reply[1]))
            return False
        record.state = to
        for name, value in changes.items():
            setattr(record, name, value)
        if to.final:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.srem(self.keys.jobs_active(), record.id)
                event = to.value.lower()
                pipe.hincrby(self.keys.jobs_stats(), stats_field(event, record.kind, record.model))
                await pipe.execute()
        return True

    async def set_fields(self, job_id: str, **values: object) -> None:
        """Set record fields that are not the state (a bulk job's ``total``)."""
        mapping = {k: "" if v is None else str(v) for k, v in values.items()}
        await self._redis.hset(self.keys.job(job_id), mapping=mapping)  # type: ignore[arg-type]

    async def state(self, job_id: str) -> JobState | None:
        """Only the job's state (None: gone)."""
        raw = await self._redis.hget(self.keys.job(job_id), "state")
        return None if raw is None else JobState(_text(raw))

    async def input(self, job_id: str) -> bytes | None:
        """The job's input (None: gone)."""
        return await self._redis.get(self.keys.job_input(job_id))

    async def store_result(self, record: JobRecord, payload: bytes) -> bool:
        """Keep a single job's answer unless one is kept already; True when this one is."""
        done = await self._redis.set(
            self.keys.job_result(record.id), payload, nx=True, exat=_expire_at_s(record)
        )
        return bool(done)

    async def result(self, job_id: str) -> bytes | None:
        """A single job's answer (None: not answered, or gone)."""
        return await self._redis.get(self.keys.job_result(job_id))

    # -- leases --------------------------------------------------------------------------

    async def take_lease(self, job_id: str, token: str, ttl_ms: int) -> bool:
        """Take the job's lease for ``token`` unless another holds it; True when taken."""
        return bool(await self._redis.set(self.keys.job_lease(job_id), token, nx=True, px=ttl_ms))

    async def renew_lease(self, job_id: str, token: str, ttl_ms: int) -> bool:
        """Extend the lease ``token`` holds by ``ttl_ms``; False when it no longer holds it."""
        return bool(await self._lease(keys=[self.keys.job_lease(job_id)], args=[token, ttl_ms]))

    async def release_lease(self, job_id: str, token: str) -> None:
        """Give the lease up if ``token`` still holds it."""
        await self._lease(keys=[self.keys.job_lease(job_id)], args=[token, 0])

    # -- bulk rows -----------------------------------------------------------------------

    async def write_rows(
        self,
        record: JobRecord,
        outputs: Sequence[tuple[int, bytes]],
        errors: Sequence[tuple[int, bytes]],
    ) -> tuple[int, int] | None:
        """Write answered and failed rows (line number, JSON line) that are not written
        yet; returns how many of each were new. Their totals are counted for
        ``/metrics`` (``rows_completed`` / ``rows_failed``). The check of the job's state
        and the write are one script: once the job is final (REVOKED by a cancellation,
        or SUCCESS / FAILURE) or gone, nothing is written and None is returned, so a
        final job's rows and counts never change.

        Raises:
            redis.exceptions.RedisError: Redis unreachable.
        """
        if not outputs and not errors:
            return 0, 0
        final = ",".join(state.value for state in JobState if state.final)
        args: list[object] = [_expire_at_s(record), f",{final},"]
        for which, rows in ((1, outputs), (2, errors)):
            for line, text in rows:
                args += [which, line, text]
        keys = [
            self.keys.job_output(record.id),
            self.keys.job_errors(record.id),
            self.keys.job(record.id),
        ]
        reply = await self._write_rows(keys=keys, args=args)
        if reply is None:
            return None
        new_outputs, new_errors = (int(n) for n in reply)
        if new_outputs or new_errors:
            async with self._redis.pipeline(transaction=False) as pipe:
                for event, count in (("rows_completed", new_outputs), ("rows_failed", new_errors)):
                    if count:
                        field = stats_field(event, record.kind, record.model)
                        pipe.hincrby(self.keys.jobs_stats(), field, count)
                await pipe.execute()
        return new_outputs, new_errors

    async def done_rows(self, job_id: str) -> set[int]:
        """Line numbers of the rows written already (answered or failed)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hkeys(self.keys.job_output(job_id))
            pipe.hkeys(self.keys.job_errors(job_id))
            done, failed = await pipe.execute()
        return {int(k) for k in (*done, *failed)}

    async def row_counts(self, job_ids: Iterable[str]) -> list[tuple[int, int]]:
        """(answered, failed) rows of each job, in order."""
        ids = list(job_ids)
        if not ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hlen(self.keys.job_output(job_id))
                pipe.hlen(self.keys.job_errors(job_id))
            counts = await pipe.execute()
        return [(int(counts[i]), int(counts[i + 1])) for i in range(0, len(counts), 2)]

    async def rows(self, job_id: str, errors: bool, lines: Sequence[int]) -> list[bytes]:
        """The written rows among ``lines`` (output or errors), in that order."""
        if not lines:
            return []
        key = self.keys.job_errors(job_id) if errors else self.keys.job_output(job_id)
        return [row for row in await self._redis.hmget(key, list(lines)) if row is not None]

    async def row_lines(self, job_id: str, errors: bool) -> list[int]:
        """Line numbers of the written rows of one kind, ascending."""
        key = self.keys.job_errors(job_id) if errors else self.keys.job_output(job_id)
        return sorted(int(k) for k in await self._redis.hkeys(key))

    async def entries_added(self, stream: str) -> int | None:
        """How many entries were ever added to ``stream`` (``XINFO STREAM``
        ``entries-added``, Redis 7); None when Redis does not say or there is no stream."""
        try:
            info = await self._redis.xinfo_stream(stream)
        except redis.exceptions.ResponseError:
            return None
        added = info.get("entries-added")
        return None if added is None else int(added)

    # -- listing and counting ------------------------------------------------------------

    async def recent(
        self, model: str | None, state: JobState | None, limit: int
    ) -> list[JobRecord]:
        """The newest jobs (at most ``limit``), of ``model`` and in ``state`` when given.

        Reads the index newest first, at most :data:`_LIST_SCAN` entries; ids whose
        record expired are taken off the index.
        """
        found: list[JobRecord] = []
        gone: list[str] = []
        start = 0
        while len(found) < limit and start < _LIST_SCAN:
            ids = [
                _text(i)
                for i in await self._redis.zrevrange(self.keys.jobs_index(), start, start + 199)
            ]
            if not ids:
                break
            start += len(ids)
            async with self._redis.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hgetall(self.keys.job(job_id))
                raws = await pipe.execute()
            for job_id, raw in zip(ids, raws, strict=True):
                if not raw:
                    gone.append(job_id)
                    continue
                try:
                    record = JobRecord.from_fields(job_id, raw)
                except ValueError:
                    continue
                if (model is None or record.model == model) and (
                    state is None or record.state is state
                ):
                    found.append(record)
                    if len(found) >= limit:
                        break
        if gone:
            await self._redis.zrem(self.keys.jobs_index(), *gone)
        return found

    async def active(self) -> list[JobRecord]:
        """Every job not finished yet (PENDING or STARTED); ids that expired are dropped."""
        ids = [_text(i) for i in await self._redis.smembers(self.keys.jobs_active())]
        if not ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(self.keys.job(job_id))
            raws = await pipe.execute()
        records, gone = [], []
        for job_id, raw in zip(ids, raws, strict=True):
            try:
                record = JobRecord.from_fields(job_id, raw) if raw else None
            except ValueError:
                record = None
            if record is None or record.state.final:
                gone.append(job_id)
            else:
                records.append(record)
        if gone:
            await self._redis.srem(self.keys.jobs_active(), *gone)
        return records

    async def counters(self) -> dict[tuple[str, str, str], int]:
        """The job counters: (event, kind, model) -> count. Events: ``submitted``,
        ``success``, ``failure``, ``revoked``, ``rows_completed``, ``rows_failed``."""
        raw = await self._redis.hgetall(self.keys.jobs_stats())
        out: dict[tuple[str, str, str], int] = {}
        for key, value in raw.items():
            parts = _text(key).split("\t", 2)
            if len(parts) == 3:
                out[(parts[0], parts[1], parts[2])] = int(value)
        return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
