"""Health checks for containers and pods: ``python -m sluice.healthcheck KIND``.

One check per kind of process, exit code 0 (healthy) or 1 with one line saying why, for
Docker's ``HEALTHCHECK`` and Kubernetes exec probes:

* ``ready [URL]``: a gateway answers 200 on ``/v2/health/ready`` (default
  ``http://127.0.0.1:$SLUICE_HTTP_PORT/v2/health/ready``, port 8000); ``live [URL]`` the
  same on ``/v2/health/live``.
* ``control``: the ``sluice serve`` of the deployment finished loading its models (the
  server record in Redis says ``startup: done``).
* ``instance --model M --version V [--instance NAME]``: the ``sluice worker`` named NAME
  (default this host's name, the worker's own default) is READY with a fresh heartbeat.
* ``jobs [--host NAME]``: a ``sluice jobs`` worker on host NAME (default this host's
  name; a job worker's Celery name is ``<worker id>@<host>``) answers Celery's ``ping``
  through the deployment's Redis within :data:`CHECK_TIMEOUT_S`.

Redis and the key prefix come from ``SLUICE_REDIS__URL`` and ``SLUICE_REDIS__KEY_PREFIX``,
as for ``sluice worker``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import urllib.error
import urllib.request

#: longest wait of one check, in s (Docker's default health check timeout is 30 s,
#: Kubernetes' 1 s; probes set their own).
CHECK_TIMEOUT_S = 3.0


def check_http(url: str) -> str | None:
    """None when ``url`` answers 200, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=CHECK_TIMEOUT_S) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        return f"{url}: {exc}"
    return None if status == 200 else f"{url}: HTTP {status}"


def check_control(redis_url: str, key_prefix: str) -> str | None:
    """None when the deployment's ``sluice serve`` finished loading, else why not."""
    import redis

    from sluice.broker.cluster import sync_client
    from sluice.broker.keys import KeySchema

    keys = KeySchema(key_prefix)
    try:
        with sync_client(redis_url, socket_timeout=CHECK_TIMEOUT_S) as client:
            startup = client.hget(keys.server(), "startup")
    except redis.exceptions.RedisError as exc:
        return f"Redis at {redis_url}: {exc}"
    if startup != b"done":
        state = startup.decode() if startup else "no server record"
        return f"sluice serve has not finished loading ({state})"
    return None


def check_instance(
    redis_url: str, key_prefix: str, model: str, version: int, instance: str
) -> str | None:
    """None when the instance is READY with a fresh heartbeat, else why not."""
    import redis

    from sluice.broker.cluster import sync_client
    from sluice.broker.keys import KeySchema
    from sluice.broker.model_store import count_live

    keys = KeySchema(key_prefix)
    try:
        with sync_client(redis_url, socket_timeout=CHECK_TIMEOUT_S) as client:
            raw = client.hget(keys.instances(model, version), instance)
    except redis.exceptions.RedisError as exc:
        return f"Redis at {redis_url}: {exc}"
    if raw is None:
        return f"no instance '{instance}' of model '{model}' version {version}"
    states, live = count_live({instance.encode(): raw}, time.time_ns())
    if not live:
        state = states.get(instance, "unknown")
        return f"instance '{instance}' is {state}, or its heartbeat is stale"
    return None


def check_jobs(redis_url: str, key_prefix: str, host: str) -> str | None:
    """None when a job worker on ``host`` answers a Celery ping, else why not."""
    import redis

    from sluice.broker.celery_app import job_app
    from sluice.broker.keys import KeySchema

    try:  # fails fast where Celery's connection would retry for seconds
        with redis.Redis.from_url(redis_url, socket_timeout=CHECK_TIMEOUT_S) as client:
            client.ping()
    except redis.exceptions.RedisError as exc:
        return f"Redis at {redis_url}: {exc}"
    app = job_app(redis_url, KeySchema(key_prefix), results=False)
    try:
        replies = app.control.ping(timeout=CHECK_TIMEOUT_S / 3)
    except Exception as exc:  # kombu raises the transport's own errors
        return f"Redis at {redis_url}: {exc}"
    finally:
        app.close()
    names = [name for reply in replies for name in reply]
    if not any(name.endswith(f"@{host}") for name in names):
        return f"no job worker on host '{host}' answered a ping (answered: {names or 'none'})"
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one check; returns 0 when healthy, 1 otherwise (the reason on standard error)."""
    parser = argparse.ArgumentParser(prog="python -m sluice.healthcheck", description=__doc__)
    sub = parser.add_subparsers(dest="kind", required=True)
    port = os.environ.get("SLUICE_HTTP_PORT", "8000")
    for kind in ("ready", "live"):
        probe = sub.add_parser(kind, help=f"a gateway answers 200 on /v2/health/{kind}")
        probe.add_argument("url", nargs="?", default=f"http://127.0.0.1:{port}/v2/health/{kind}")
    sub.add_parser("control", help="sluice serve finished loading its models")
    instance = sub.add_parser("instance", help="a sluice worker is READY and beating")
    instance.add_argument("--model", required=True)
    instance.add_argument("--version", type=int, default=1)
    instance.add_argument("--instance", default=None)
    jobs = sub.add_parser("jobs", help="a sluice jobs worker on this host answers a ping")
    jobs.add_argument("--host", default=None)
    args = parser.parse_args(argv)
    redis_url = os.environ.get("SLUICE_REDIS__URL", "redis://127.0.0.1:6379/0")
    key_prefix = os.environ.get("SLUICE_REDIS__KEY_PREFIX", "sluice:")
    if args.kind in ("ready", "live"):
        problem = check_http(args.url)
    elif args.kind == "control":
        problem = check_control(redis_url, key_prefix)
    elif args.kind == "jobs":
        problem = check_jobs(redis_url, key_prefix, args.host or socket.gethostname())
    else:
        name = args.instance or socket.gethostname()
        problem = check_instance(redis_url, key_prefix, args.model, args.version, name)
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
