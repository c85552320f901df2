"""Dependency audit: the installed Python packages against known vulnerabilities.

``.venv/bin/python scripts/audit.py`` runs pip-audit (PyPA) on the environment it runs
in (``pip-audit --local``; the editable Sluice itself skipped), or with
``--requirements FILE`` on the pins of a requirements file. Exit codes:

* 0: no known vulnerability, or the advisory service could not be used (see below);
* 1: at least one installed package has a known vulnerability (one line each: package,
  version, advisory id, fixed versions);
* 2: pip-audit itself failed.

Whether the advisory service answers is decided by a canary: before the audit, a pin
with published advisories (:data:`CANARY`) is audited. When the service is unreachable,
or answers nothing usable (a proxy or mirror that knows no package), pip-audit reports
"no known vulnerabilities" for everything; the canary is then not flagged, and the
audit is reported as skipped with exit code 0, so CI does not fail for a network it
does not control. ``--strict`` (or ``SLUICE_AUDIT_STRICT=1``) makes that exit code 1.
pip-audit: https://pypi.org/project/pip-audit/ (advisories from PyPI's JSON API, which
takes them from the PyPA advisory database and OSV).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: a pin with published advisories (urllib3 1.26.4: PYSEC-2021-108 and later ones).
CANARY = "urllib3==1.26.4"
#: longest one pip-audit run may take, in s.
TIMEOUT_S = 300.0


def pip_audit(args: list[str], timeout_s: float = TIMEOUT_S) -> dict[str, Any] | None:
    """Run pip-audit with ``args`` and JSON output; its report, or None when it produced
    none (it failed: its error is printed)."""
    command = [sys.executable, "-m", "pip_audit", "--format", "json", "--progress-spinner",
               "off", *args]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"audit: pip-audit did not finish within {timeout_s:.0f} s", file=sys.stderr)
        return None
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"audit: pip-audit failed (exit {done.returncode}): {tail}", file=sys.stderr)
        return None
    return report if isinstance(report, dict) else None


def findings(report: dict[str, Any]) -> list[str]:
    """One line per known vulnerability in a pip-audit JSON report."""
    lines = []
    for dep in report.get("dependencies", []):
        for vuln in dep.get("vulns", []):
            fixed = ", ".join(vuln.get("fix_versions", [])) or "none yet"
            lines.append(
                f"{dep['name']} {dep.get('version', '?')}: {vuln['id']} (fixed in {fixed})"
            )
    return lines


def skipped(report: dict[str, Any]) -> list[str]:
    """The packages pip-audit could not audit (not on PyPI: local builds)."""
    return [dep["name"] for dep in report.get("dependencies", []) if dep.get("skip_reason")]


def service_answers(canary: str = CANARY) -> bool:
    """Whether the advisory service flags ``canary`` (a pin with known advisories)."""
    with tempfile.TemporaryDirectory() as tmp:
        pins = Path(tmp) / "canary.txt"
        pins.write_text(canary + "\n")
        report = pip_audit(["--requirement", str(pins), "--no-deps", "--disable-pip"])
    return report is not None and bool(findings(report))


def main(argv: list[str] | None = None) -> int:
    """Audit; returns the exit code (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="scripts/audit.py", description=__doc__.split("\n")[0])
    parser.add_argument("--requirements", type=Path, help="audit these pins instead")
    parser.add_argument(
        "--strict",
        action="store_true",
        default=os.environ.get("SLUICE_AUDIT_STRICT") == "1",
        help="fail (exit 1) when the advisory service cannot be used",
    )
    parser.add_argument("--ignore-vuln", action="append", default=[], help="advisory id")
    args = parser.parse_args(argv)
    if not service_answers():
        print(
            f"audit: skipped: the advisory service did not flag {CANARY}, a pin with known "
            "advisories (unreachable, or a mirror without advisories)",
            file=sys.stderr,
        )
        return 1 if args.strict else 0
    target = (
        ["--requirement", str(args.requirements), "--no-deps", "--disable-pip"]
        if args.requirements
        else ["--local", "--skip-editable"]
    )
    for vuln in args.ignore_vuln:
        target += ["--ignore-vuln", vuln]
    report = pip_audit(target)
    if report is None:
        return 2
    found = findings(report)
    for line in found:
        print(f"audit: vulnerable: {line}")
    left_out = skipped(report)
    audited = len(report.get("dependencies", [])) - len(left_out)
    print(
        f"audit: {audited} packages audited, {len(found)} known vulnerabilities"
        + (f"; not audited (not on PyPI): {', '.join(left_out)}" if left_out else "")
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
