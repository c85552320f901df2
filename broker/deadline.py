"""Ending a process by a deadline: a daemon thread that exits the process when a stop
takes too long (shared by the supervisor, the model instances and the job workers; the
main thread may be held in a call nothing else bounds, such as a read from a Redis that
accepts connections and answers nothing)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable

__all__ = ["exit_deadline"]


def exit_deadline(
    limit_s: float,
    message: str,
    before_exit: Callable[[], None] | None = None,
    done: threading.Event | None = None,
) -> threading.Thread:
    """Start a daemon thread that ends this process ``limit_s`` s from now, unless ``done``
    is set by then: it logs ``message`` (error), calls ``before_exit`` (kill what the
    process started), flushes the log handlers and exits with code 1 (``os._exit``: the
    main thread may be held in a call that nothing else bounds, such as a read from a
    Redis that accepts connections and answers nothing).

    Returns:
        The started thread.
    """

    def enforce() -> None:
        if done is not None and done.wait(limit_s):
            return
        if done is None:
            time.sleep(limit_s)
        logging.getLogger(__name__).error("%s", message)
        if before_exit is not None:
            before_exit()
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(1)

    thread = threading.Thread(target=enforce, name="sluice-exit-deadline", daemon=True)
    thread.start()
    return thread
