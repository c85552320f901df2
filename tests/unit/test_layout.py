"""The package layout's rules, read from the source: which package may import which,
no import cycles between modules, and no module past the size the team keeps to."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Import name -> folder (pyproject.toml's package-dir mapping).
PACKAGES = {
    "sluice": ROOT / "sluice",
    "sluice.api": ROOT / "api",
    "sluice.broker": ROOT / "broker",
    "sluice.gpu_workers": ROOT / "gpu_workers",
    "sluice.job_workers": ROOT / "job_workers",
    "sluice.batching": ROOT / "batching",
    "sluice.repository": ROOT / "repository",
}

#: Which of our packages each package may import (besides itself). The gateway
#: (``api``) and the model instance (``gpu_workers``) never import each other; the job
#: worker (``job_workers``) queues requests through the gateway's handlers, and nothing
#: of ours imports it but the CLI and the supervisor (``sluice``), which sit above all.
ALLOWED = {
    "sluice.batching": set(),
    "sluice.repository": set(),
    "sluice.broker": {"sluice.batching", "sluice.repository"},
    "sluice.gpu_workers": {"sluice.broker", "sluice.batching", "sluice.repository"},
    "sluice.api": {"sluice.broker", "sluice.batching", "sluice.repository"},
    "sluice.job_workers": {"sluice.api", "sluice.broker", "sluice.batching", "sluice.repository"},
    "sluice": {
        "sluice.api",
        "sluice.job_workers",
        "sluice.broker",
        "sluice.gpu_workers",
        "sluice.batching",
        "sluice.repository",
    },
}

MAX_LINES = 460


def _modules() -> Iterator[tuple[str, Path]]:
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts))
            yield name.removesuffix(".__init__"), path


def _package_of(module: str) -> str:
    """The longest entry of :data:`PACKAGES` that ``module`` lies in."""
    best = ""
    for package in PACKAGES:
        if (module == package or module.startswith(package + ".")) and len(package) > len(best):
            best = package
    return best


def _imports(name: str, path: Path) -> set[str]:
    """Our modules that ``path`` imports, at any depth of the file (lazy imports count)."""
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "sluice")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module.split(".")[0] == "sluice":
                found.add(module)
                found.update(f"{module}.{a.name}" for a in node.names)
    return found


MODULES = dict(_modules())


def _resolve(target: str) -> str | None:
    """``sluice.broker.keys.KeySchema`` -> ``sluice.broker.keys`` (a module we have)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layout(module: str) -> None:
    own = _package_of(module)
    for target in _imports(module, MODULES[module]) - {"sluice", "sluice.__version__"}:
        other = _package_of(target)
        assert other == own or other in ALLOWED[own], f"{module} imports {target}"


def test_no_import_cycles() -> None:
    graph = {
        m: {t for t in (_resolve(i) for i in _imports(m, p)) if t and t != m}
        for m, p in MODULES.items()
    }
    # a package's __init__ re-exporting its own modules is not a cycle of design
    for m in graph:
        graph[m] = {t for t in graph[m] if not m.startswith(t + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle = [*stack[stack.index(t) :], t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module}: {lines} lines; split it by job"
