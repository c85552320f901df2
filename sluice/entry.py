"""The ``sluice`` console script: :func:`sluice.cli.main`, quiet when Ctrl-C comes first.

``sluice.cli`` imports most of the project (FastAPI, grpcio, redis-py, numpy: ~0.5 s)
before any signal handler of its own is set. A ``KeyboardInterrupt`` raised in that
time would end the command with a traceback, and not always as a
``KeyboardInterrupt`` (one raised inside a class body's ``__set_name__`` becomes a
``RuntimeError``), so the imports run with a SIGINT handler that only notes the signal.
"""

from __future__ import annotations

import signal
import sys

#: a shell's exit code for a command ended by SIGINT (128 + 2).
INTERRUPTED = 130


def main() -> int:
    """Run ``sluice``.

    Returns:
        The command's exit code; :data:`INTERRUPTED` for a Ctrl-C during the imports,
        with no traceback (nothing was started yet).
    """
    interrupted: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: interrupted.append(signum))
    from sluice.cli import main as cli_main

    if interrupted:
        return INTERRUPTED
    # Python's own handler, even where SIGINT came ignored (a background job of a script,
    # nohup): Ctrl-C is how every command stops, and a SIGINT until ``sluice serve`` sets
    # its handler would otherwise be lost while it goes on starting
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return cli_main()
    except KeyboardInterrupt:  # `sluice gateway` / `sluice worker` before their handlers
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
