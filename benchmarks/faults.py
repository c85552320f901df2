"""The fault suite's report: each fault injected into a fresh deployment under load, one
row per fault.

Usage::

    python benchmarks/faults.py [--fault NAME ...] [--workdir DIR]

Each fault (``--fault`` picks some by a part of their name; default all) starts
``sluice serve`` (two gateways sharing one HTTP and one gRPC port, the ``ledger`` Python
model with two instances, one job worker) on a ``redis-server`` of its own on a free
port, sends a steady load (two HTTP clients, two gRPC clients, one gRPC stream; async
jobs too where the job worker is killed; every request with a unique id and a known
answer), injects the fault 1.5 s in, and goes on until every kind of client is answered
again. It prints a Markdown table: accepted, answered ok, answered with an error (by
status), lost, answered twice, ran twice, time to recover (what each means:
``tests/e2e/fault_support.py``). ``tests/e2e/test_faults.py`` runs the same faults and
asserts lost = 0 and answered twice = 0. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))


def _commit() -> str:
    result = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
        check=False, timeout=10,
    )  # fmt: skip
    return result.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    """Run the chosen faults and print their table; exit code 1 when a request was lost
    or answered twice."""
    from fault_support import FAULTS, run_fault, table

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", action="append", default=[], help="part of a fault's name")
    parser.add_argument("--workdir", type=Path, default=None, help="where logs are kept")
    args = parser.parse_args(argv)
    names = [n for n in FAULTS if not args.fault or any(f.lower() in n.lower() for f in args.fault)]
    if not names:
        parser.error(f"no fault matches {args.fault}; faults: {list(FAULTS)}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sluice-faults-"))
    rows = []
    for number, name in enumerate(names):
        print(f"[{number + 1}/{len(names)}] {name} ...", file=sys.stderr, flush=True)
        rows.append(run_fault(name, workdir / f"fault-{number}"))
    python = f"{platform.python_implementation()} {platform.python_version()}"
    machine = f"{platform.machine()} with {os.cpu_count()} CPUs"
    print(f"commit {_commit()}, {machine}, {python}; logs in {workdir}\n")
    print(table(rows))
    return 1 if any(row.lost or row.twice for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
