"""The ``sluice`` console script: :func:`api.cli.main`, quiet when Ctrl-C comes first.

``api.cli`` imports most of the project (FastAPI, grpcio, redis-py, numpy: ~0.5 s)
before any signal handler of its own is set; a Ctrl-C in that time would end the
command with a ``KeyboardInterrupt`` traceback.
"""

from __future__ import annotations

import sys


def main() -> int:
    """Run ``sluice``.

    Returns:
        The command's exit code; 130 (a shell's code for an interrupted command) for a
        Ctrl-C before the command set its own handler, with no traceback.
    """
    try:
        from api.cli import main as cli_main

        return cli_main()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
