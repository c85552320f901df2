"""The whole Redis key schema of Sluice, in one place.

Every key starts with the deployment's prefix (default ``sluice:``). Keys of
one model carry the hash tag ``{model}`` so a Redis Cluster keeps them in one
slot (docs/architecture.md, the Redis key schema).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from redis.crc import key_slot

#: consumer group every instance of a model joins on the model's stream.
WORKER_GROUP = "instances"

#: hash slots of a Redis Cluster (its specification: CRC16 of the key's ``{tag}`` mod 16384).
SLOTS = 16384
#: hash tags tried per shard when placing it (:func:`shard_tag`): the closest slot found is
#: within a few slots of the one aimed at.
_SHARD_CANDIDATES = 4096

#: what the keys of async jobs start with after the prefix (``job:``, ``jobs:``): kept
#: when ``sluice serve`` starts again, so accepted jobs outlive a restart.
JOB_NAMESPACES = ("job:", "jobs:")


@dataclass(frozen=True, slots=True)
class KeySchema:
    """Builds key names under one prefix.

    Attributes:
        prefix: namespace of one Sluice deployment, e.g. ``sluice:``.
    """

    prefix: str = "sluice:"

    def queue(
        self, model: str, version: int, level: int = 0, shard: int = 0, shards: int = 1
    ) -> str:
        """Stream of queued requests of one model version (one per priority level > 0, and
        per queue shard when the queue is split over ``shards`` streams: shard 0 keeps the
        model's own hash tag, shard k > 0 the tag :func:`shard_tag` places)."""
        suffix = f":p{level}" if level > 0 else ""
        return f"{self.prefix}{{{shard_tag(model, shard, shards)}}}:q:{version}{suffix}"

    def sequence_queue(self, model: str, version: int, instance: str) -> str:
        """Stream of the steps of the sequences bound to one model instance (sequence
        batching: a sequence's requests all go to the instance that holds it)."""
        return f"{self.prefix}{{{model}}}:q:{version}:s:{instance}"

    def sequence(self, model: str, version: int, corrid: str) -> str:
        """Hash of one live sequence: its instance, step counts, implicit state and last
        answer (``broker.sequences``); ``corrid`` is the tagged correlation id
        (``u:<int>`` or ``s:<string>``). Expires after the sequence's idle time."""
        return f"{self.prefix}{{{model}}}:seq:{version}:{corrid}"

    def is_job(self, key: str) -> bool:
        """Whether ``key`` is one of the async jobs' keys (:data:`JOB_NAMESPACES`) of this
        prefix: records, inputs, results, rows, and Celery's queue."""
        return key.startswith(tuple(self.prefix + n for n in JOB_NAMESPACES))

    def is_sequence(self, key: str) -> bool:
        """Whether ``key`` is a live sequence's hash (:meth:`sequence`) of this prefix."""
        return key.startswith(self.prefix) and "}:seq:" in key

    def reply(self, gateway_id: str) -> str:
        """List a gateway process reads its responses from."""
        return f"{self.prefix}reply:{gateway_id}"

    def stream_credit(self, request_id: str) -> str:
        """Integer: how many responses of a decoupled request its gateway has passed to
        the client (the producer stays within a window of it); -1: the client cancelled.
        Expires with the request's deadline."""
        return f"{self.prefix}credit:{request_id}"

    def state(self, model: str) -> str:
        """Hash: version -> JSON ``{"state", "reason"}``."""
        return f"{self.prefix}{{{model}}}:state"

    def config(self, model: str) -> str:
        """String: the effective (completed) model config as protobuf JSON."""
        return f"{self.prefix}{{{model}}}:config"

    def instances(self, model: str, version: int) -> str:
        """Hash: instance name -> JSON ``{"state", "pid", "reason"}``."""
        return f"{self.prefix}{{{model}}}:instances:{version}"

    def models(self) -> str:
        """Hash: model name -> JSON of where it was found (the repository index)."""
        return f"{self.prefix}models"

    def server(self) -> str:
        """Hash: server-wide facts (``startup``: ``loading`` | ``done``)."""
        return f"{self.prefix}server"

    def staged_config(self, model: str, generation: int) -> str:
        """String: the config instances of one load generation start with (before publishing)."""
        return f"{self.prefix}{{{model}}}:config:g{generation}"

    def deployment(self) -> str:
        """Lease of the ``sluice serve`` owning this prefix (``supervisor/deployment_lease.py``)."""
        return f"{self.prefix}deployment"

    def control(self) -> str:
        """Stream of model control commands (load / unload) for the supervisor."""
        return f"{self.prefix}control"

    # The statistics and latency histograms of a version whose queue is split over shards
    # live in several slots: each instance's under the hash tag of the queue shard it
    # waits on (``tag``; None: the model's own), so that they spread with the queue.

    def stats(self, model: str, version: int, tag: str | None = None) -> str:
        """Hash of the counters the gateways add to (rejections, cancellations; the
        model's own tag), and the hash shards of tag ``tag`` are folded into."""
        return f"{self.prefix}{{{tag or model}}}:stats:{version}"

    def stats_shard(self, model: str, version: int, instance: str, tag: str | None = None) -> str:
        """Hash of one model instance's counters, as totals (``stats_store.StatsShard``)."""
        return f"{self.prefix}{{{tag or model}}}:stats:{version}:i:{instance}"

    def stats_shards(self, model: str, version: int, tag: str | None = None) -> str:
        """Set of the ``stats_shard`` keys of tag ``tag`` (readers add them to ``stats``)."""
        return f"{self.prefix}{{{tag or model}}}:stats:{version}:shards"

    def stats_tags(self, model: str, version: int) -> str:
        """Set of the hash tags other than the model's own that hold statistics of the
        version (queue shards' tags; readers read each)."""
        return f"{self.prefix}{{{model}}}:stats:{version}:tags"

    def cache_entry(self, digest: str) -> str:
        """String: one response cache entry (``broker.response_cache``)."""
        return f"{self.prefix}{{cache}}:e:{digest}"

    def cache_lru(self) -> str:
        """Sorted set: response cache entry key -> last use (ms since the epoch)."""
        return f"{self.prefix}{{cache}}:lru"

    def cache_bytes(self) -> str:
        """Integer: bytes the response cache entries hold."""
        return f"{self.prefix}{{cache}}:bytes"

    def cache_stats(self) -> str:
        """Hash: the response cache's own counters (hits, misses, lookups, evictions,
        lookup_ns, insert_ns), added to by every gateway."""
        return f"{self.prefix}{{cache}}:stats"

    def latency_window(self, model: str, version: int, tag: str | None = None) -> str:
        """Prefix of the version's latency histograms of tag ``tag`` (None: the model's
        own), one hash per age bucket (the bucket number follows; ``broker.latency_window``)."""
        return f"{self.prefix}{{{tag or model}}}:latency:{version}:"

    # -- async jobs (docs/user-guide/jobs.md); a job's keys share the hash tag of its id --

    def job(self, job_id: str) -> str:
        """Hash: one job's record (``broker.job_records.JobRecord``)."""
        return f"{self.prefix}job:{{{job_id}}}"

    def job_input(self, job_id: str) -> str:
        """String: a single job's request (``encode_job_request``) or a bulk job's
        JSON-lines body."""
        return f"{self.prefix}job:{{{job_id}}}:input"

    def job_result(self, job_id: str) -> str:
        """String: a single job's answer (an encoded ``InferResponseMessage``)."""
        return f"{self.prefix}job:{{{job_id}}}:result"

    def job_output(self, job_id: str) -> str:
        """Hash: a bulk job's answered rows, line number -> output JSON line."""
        return f"{self.prefix}job:{{{job_id}}}:output"

    def job_errors(self, job_id: str) -> str:
        """Hash: a bulk job's failed rows, line number -> error JSON line."""
        return f"{self.prefix}job:{{{job_id}}}:errors"

    def job_lease(self, job_id: str) -> str:
        """String: the token of the job worker running the job, with a short expiry."""
        return f"{self.prefix}job:{{{job_id}}}:lease"

    def job_keys(self, job_id: str) -> list[str]:
        """Every key of one job but its lease (what expires with its record)."""
        return [
            self.job(job_id),
            self.job_input(job_id),
            self.job_result(job_id),
            self.job_output(job_id),
            self.job_errors(job_id),
        ]

    def jobs_index(self) -> str:
        """Sorted set: job id -> creation time (ms since the epoch), for listing."""
        return f"{self.prefix}jobs:index"

    def jobs_active(self) -> str:
        """Set: ids of the jobs not finished yet (PENDING or STARTED)."""
        return f"{self.prefix}jobs:active"

    def jobs_stats(self) -> str:
        """Hash: job counters (``<event>\t<kind>\t<model>`` -> count) for ``/metrics``."""
        return f"{self.prefix}jobs:stats"

    def celery_prefix(self) -> str:
        """What every key of the jobs' Celery broker and result backend starts with."""
        return f"{self.prefix}jobs:celery:"


@lru_cache(maxsize=4096)
def shard_tag(model: str, shard: int, shards: int) -> str:
    """The hash tag of queue shard ``shard`` of ``shards`` of ``model``.

    Shard 0 is the model's own tag (a model with one shard keeps its keys in one slot).
    Shard k's tag is ``<model>#<k>.<j>``, the ``j`` chosen (the first of the closest)
    so that its slot lies k/``shards`` of the way round the slot ring from the model's
    own: on a cluster whose primaries hold equal slot ranges (what ``redis-cli --cluster
    create`` makes), ``shards`` equal to the number of primaries puts one shard on each
    primary, and a multiple of it the same number on each. Every process computes the
    same tags from the name alone.
    """
    if shard == 0:
        return model
    home = key_slot(model.encode())
    aim = (home + shard * SLOTS // shards) % SLOTS
    best, best_gap = "", SLOTS
    for j in range(_SHARD_CANDIDATES):
        tag = f"{model}#{shard}.{j}"
        gap = abs(key_slot(tag.encode()) - aim)
        gap = min(gap, SLOTS - gap)
        if gap < best_gap:
            best, best_gap = tag, gap
            if gap == 0:
                break
    return best


def hash_tag(key: str) -> str:
    """What a Redis Cluster hashes of ``key``: the text of its first non-empty ``{...}``,
    else the whole key (keys with equal tags share a slot)."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key
