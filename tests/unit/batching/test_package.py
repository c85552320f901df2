"""Package-level checks: exports, error codes, and the purity rule (no I/O, no clock)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from sluice import batching
from sluice.batching import BatchingError, BatchingPolicyError

PACKAGE = Path(batching.__file__).parent


def test_all_names_exist() -> None:
    assert sorted(batching.__all__) == sorted(set(batching.__all__))
    for name in batching.__all__:
        assert hasattr(batching, name), name


def test_error_codes_are_triton_names() -> None:
    assert BatchingError.code == "INTERNAL"
    assert BatchingPolicyError.code == "INVALID_ARG"
    assert issubclass(BatchingPolicyError, ValueError)


def _root(module: str) -> str:
    """``sluice.batching.dynamic`` -> ``sluice.batching``; ``numpy.typing`` -> ``numpy``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "sluice" else parts[0]


def test_imports_only_stdlib_and_numpy() -> None:
    allowed = set(sys.stdlib_module_names) | {"numpy", "sluice.batching", "__future__"}
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                roots = [_root(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = [_root(node.module)]
            else:
                continue
            assert set(roots) <= allowed, f"{path.name} imports {roots}"
            assert "time" not in roots, f"{path.name} must take now_ns, not read a clock"
