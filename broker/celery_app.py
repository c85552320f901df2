"""The Celery application of async jobs: Redis as broker and result backend.

Built from settings by a factory and passed around (Celery's user guide, "Application":
"Breaking the chain"); no ``celeryconfig`` module. Every key Celery writes starts with
the deployment's job prefix (``KeySchema.celery_prefix``; kombu's and Celery's
``global_keyprefix`` transport option), so deployments sharing a Redis do not see each
other's tasks. What the options are for:

* ``task_acks_late`` + ``task_reject_on_worker_lost``: a task's message is acknowledged
  when the task returns, so one whose job worker dies is delivered again;
* ``visibility_timeout`` (kombu's Redis transport): how long a message taken and not
  acknowledged waits before it is delivered again; swept every second
  (``unacked_restore_interval`` 1, ``unacked_restore_throttle`` 1), so a killed job
  worker's task runs again within that timeout and a second;
* ``worker_prefetch_multiplier`` 1: a worker holds no more messages than it runs;
* events on (``worker_send_task_events``, ``task_send_sent_event``), so Flower shows the
  jobs; ``task_track_started`` records STARTED in the result backend;
* ``broker_use_ssl`` / ``redis_backend_use_ssl`` for a ``rediss://`` URL: the TLS files
  its query names (``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, as redis-py reads
  them) and ``ssl_cert_reqs`` (default ``required``: the server's certificate is checked).

Celery docs: https://docs.celeryq.dev/en/stable/userguide/configuration.html and
https://docs.celeryq.dev/en/stable/getting-started/backends-and-brokers/redis.html.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

from celery import Celery

from sluice.broker.keys import KeySchema

__all__ = ["JOB_QUEUE", "RUN_JOB", "TLS_QUERY_KEYS", "celery_tls", "celery_url", "job_app"]

#: the task that runs one job; its one argument is the job id.
RUN_JOB = "sluice.jobs.run"
#: the queue job tasks go to (a Redis list under the job prefix).
JOB_QUEUE = "jobs"


def celery_url(redis_url: str) -> str:
    """The URL kombu and Celery's Redis backend take for ``redis_url``: a Unix socket
    (``unix:///path/redis.sock?db=N``, what a private redis-server listens on) becomes
    ``redis+socket:///path/redis.sock?virtual_host=N``; others are unchanged."""
    parts = urlsplit(redis_url)
    if parts.scheme != "unix":
        return redis_url
    db = parse_qs(parts.query).get("db", ["0"])[0]
    return f"redis+socket://{parts.path}?virtual_host={db}"


#: query parameters of a ``rediss://`` URL that are TLS options (redis-py's names).
TLS_QUERY_KEYS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def celery_tls(redis_url: str) -> tuple[str, dict[str, Any] | None]:
    """The URL without its TLS query parameters and Celery's ``broker_use_ssl`` /
    ``redis_backend_use_ssl`` dict for them; ``(redis_url, None)`` unless it is
    ``rediss://``.

    Raises:
        ValueError: ``ssl_cert_reqs`` is not ``none``, ``optional`` or ``required``
            (``CERT_`` prefix and case ignored).
    """
    parts = urlsplit(redis_url)
    if parts.scheme != "rediss":
        return redis_url, None
    query = parse_qsl(parts.query, keep_blank_values=True)
    options: dict[str, Any] = {k: v for k, v in query if k in TLS_QUERY_KEYS}
    reqs = str(options.get("ssl_cert_reqs", "required")).lower().removeprefix("cert_")
    if reqs not in _CERT_REQS:
        raise ValueError(f"ssl_cert_reqs must be none, optional or required, got '{reqs}'")
    options["ssl_cert_reqs"] = _CERT_REQS[reqs]
    rest = urlencode([(k, v) for k, v in query if k not in TLS_QUERY_KEYS])
    return parts._replace(query=rest).geturl(), options


def job_app(
    redis_url: str,
    keys: KeySchema,
    *,
    visibility_timeout_s: float = 10.0,
    result_expires_s: int = 86400,
    results: bool = True,
) -> Celery:
    """The jobs' Celery application.

    Args:
        redis_url: the deployment's Redis.
        keys: the deployment's key schema (the Celery keys' prefix).
        visibility_timeout_s: how long a message a worker took and did not acknowledge
            waits before it is delivered again, in s.
        result_expires_s: how long Celery keeps a task's result, in s.
        results: use the Redis result backend; a gateway, which only sends tasks, goes
            without (sending a task would subscribe it to the task's result).
    """
    url, tls = celery_tls(celery_url(redis_url))
    prefix = {"global_keyprefix": keys.celery_prefix()}
    app = Celery("sluice", broker=url, backend=url if results else None, set_as_current=False)
    if tls is not None:
        app.conf.update(broker_use_ssl=tls, redis_backend_use_ssl=tls)
    app.conf.update(
        broker_transport_options={
            **prefix,
            "visibility_timeout": visibility_timeout_s,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        },
        result_backend_transport_options=prefix,
        broker_connection_retry_on_startup=True,
        task_default_queue=JOB_QUEUE,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_track_started=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=True,
        task_send_sent_event=True,
        result_expires=result_expires_s,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
    )
    return app
