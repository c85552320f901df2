"""What every front end of one gateway process shares: the handlers, wired once.

The HTTP routes and the gRPC servicer call the same handlers (:mod:`api.handlers`):
health, metadata, repository control, statistics and submission (MLServer's
``handlers/dataplane.py`` and ``handlers/model_repository.py`` split the same way).
"""

from __future__ import annotations

from collections.abc import Callable

import redis.asyncio

from sluice.api.handlers import (
    Health,
    Metadata,
    RepositoryControl,
    RequestQueue,
    Shutdown,
    Statistics,
    Submission,
)
from sluice.api.handlers.jobs import Jobs
from sluice.api.log_settings import LogSettings
from sluice.api.models import ModelRegistry
from sluice.api.request_trace import Tracing
from sluice.api.response_cache import ResponseCache
from sluice.api.settings import GatewaySettings
from sluice.broker.keys import KeySchema
from sluice.broker.multiplex import MultiplexedConnection
from sluice.broker.replies import ReplyRouter

__all__ = ["DataPlane"]


class DataPlane:
    """The handlers of one gateway process and what they share.

    Args:
        settings: the gateway settings.
        client: the gateway's Redis client.
        registry: cached model views.
        router: this gateway's reply router (started by the caller).
        connection: the multiplexed connection requests are queued through (started
            with the router).

    Attributes:
        health: server and model liveness and readiness.
        metadata: server and model metadata, model configuration.
        repository: the repository index, model load and unload.
        statistics: the statistics extension.
        submission: inference requests (resolve, validate, queue, await).
        jobs: async jobs (accept, look up, cancel, list).
        queue: the model versions' request queues (cancellation, the exit's clean-up).
        log_settings: the logging extension's settings.
        tracing: the trace extension's settings and this process's traces.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        client: redis.asyncio.Redis,
        registry: ModelRegistry,
        router: ReplyRouter,
        connection: MultiplexedConnection,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.router = router
        self.connection = connection
        keys = KeySchema(settings.redis.key_prefix)
        self.shutdown = Shutdown()
        self.log_settings = LogSettings.from_options(settings.log_options())
        self.tracing = Tracing(settings.trace)
        self.health = Health(settings, registry, self.shutdown)
        self.metadata = Metadata(settings, registry)
        self.repository = RepositoryControl(settings, client, keys, registry, router)
        self.statistics = Statistics(client, keys, registry)
        self.queue = RequestQueue(
            client, connection, keys, router, self.shutdown, settings.redis.socket_timeout_s
        )
        cache = (
            ResponseCache(connection, keys, settings.cache_size_bytes)
            if settings.cache_size_bytes > 0
            else None
        )
        self.submission = Submission(settings, registry, router, self.queue, self.shutdown, cache)
        self.jobs = Jobs(settings, client, self.submission)

    def begin_shutdown(self) -> None:
        """Refuse new inference requests from now on (the server is exiting).

        Requests already queued are still awaited; new ones get UNAVAILABLE at once
        instead of being queued for instances that are stopping. Calls what
        :meth:`on_shutdown` registered (once).
        """
        self.shutdown.begin()

    def on_shutdown(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Have ``callback`` called when this gateway begins to shut down
        (:meth:`begin_shutdown`; at once if it has); returns the function that withdraws
        it. A deployment seen exiting from here (the gateway runs on) calls nothing."""
        return self.shutdown.on_begin(callback)
