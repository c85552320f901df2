"""``scripts/audit.py``: the dependency audit of ``.ci/run`` (pip-audit), which fails on
a known-vulnerable pin and is skipped, not failed, when the advisory service cannot be
used."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_support import load_module

audit = load_module("scripts/audit.py", "audit")

REPORT = {
    "dependencies": [
        {
            "name": "urllib3",
            "version": "1.26.4",
            "vulns": [
                {"id": "PYSEC-2021-108", "fix_versions": ["1.26.5"], "aliases": []},
                {"id": "GHSA-v845-jxx5-vc9f", "fix_versions": [], "aliases": []},
            ],
        },
        {"name": "numpy", "version": "2.1.0", "vulns": []},
        {"name": "torch", "skip_reason": "Dependency not found on PyPI"},
    ],
    "fixes": [],
}


def test_findings_are_one_line_per_advisory() -> None:
    assert audit.findings(REPORT) == [  # type: ignore[attr-defined]
        "urllib3 1.26.4: PYSEC-2021-108 (fixed in 1.26.5)",
        "urllib3 1.26.4: GHSA-v845-jxx5-vc9f (fixed in none yet)",
    ]
    assert audit.skipped(REPORT) == ["torch"]  # type: ignore[attr-defined]


def test_a_vulnerable_pin_fails_or_the_audit_is_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Against the real advisory service: the canary pin fails the audit (exit 1, named)
    where the service answers; where it cannot be used, the audit says it is skipped
    and exits 0, or 1 with --strict."""
    pins = tmp_path / "requirements.txt"
    pins.write_text(audit.CANARY + "\n")  # type: ignore[attr-defined]
    code = audit.main(["--requirements", str(pins)])  # type: ignore[attr-defined]
    out, err = capsys.readouterr()
    if "skipped" in err:
        assert code == 0, err
        assert audit.main(["--requirements", str(pins), "--strict"]) == 1  # type: ignore[attr-defined]
    else:
        assert code == 1, out + err
        assert "audit: vulnerable: urllib3 1.26.4: " in out


def test_a_failing_pip_audit_is_exit_code_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit, "service_answers", lambda: True)
    missing = tmp_path / "missing.txt"
    assert audit.main(["--requirements", str(missing)]) == 2  # type: ignore[attr-defined]
