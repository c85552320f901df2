"""What installing Sluice puts into site-packages, read from a wheel built from this tree.

Sluice installs under one import name, ``sluice``: the top-level folders are its
subpackages (pyproject.toml's package-dir mapping), so no generic name such as ``api`` or
``broker`` lands beside a user's own packages in the process that imports their
``model.py``. A user model still does ``import triton_python_backend_utils as pb_utils``:
the python backend registers that name when it is imported.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
#: Import name -> source folder, as pyproject.toml maps them.
PACKAGE_DIRS: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """A wheel built (setuptools' PEP 517 hook, as ``pip wheel --no-build-isolation``
    runs it) from a copy of the tree, so the build writes nothing into the checkout."""
    source = tmp_path_factory.mktemp("source")
    out = tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", PYPROJECT["project"]["readme"]):
        shutil.copy2(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in set(PACKAGE_DIRS.values()):
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])",
            str(out),
        ],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (built,) = out.glob("*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def _files(wheel: zipfile.ZipFile) -> set[str]:
    return {name for name in wheel.namelist() if not name.endswith("/")}


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [p for p in wheel.namelist() if p.endswith(f".dist-info/{name}")]
    return wheel.read(path).decode()


def test_the_only_top_level_import_name_is_sluice(wheel: zipfile.ZipFile) -> None:
    top = {name.split("/")[0] for name in _files(wheel)}
    top = {name.removesuffix(".py") for name in top if not name.endswith(".dist-info")}
    assert top == {"sluice"}
    assert _dist_info(wheel, "top_level.txt").split() == ["sluice"]


def test_every_source_module_is_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    """A folder left out of ``packages`` in pyproject.toml would install without its
    modules; every ``.py`` of a mapped folder is in the wheel under its import path."""
    expected = set()
    for package, folder in PACKAGE_DIRS.items():
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT / folder).as_posix()
            expected.add(f"{package.replace('.', '/')}/{relative}")
    assert expected - _files(wheel) == set()


def test_the_wheel_carries_the_dashboard_page_and_the_console_script(
    wheel: zipfile.ZipFile,
) -> None:
    assert "sluice/api/dashboard/page.html" in _files(wheel)
    assert "sluice = sluice.entry:main" in _dist_info(wheel, "entry_points.txt")


def test_a_user_model_imports_triton_python_backend_utils(tmp_path: Path) -> None:
    """In a fresh interpreter (the installed project): the name is not importable on its
    own, and a ``model.py`` loaded after the python backend module imports it as under
    Triton."""
    model = tmp_path / "model.py"
    model.write_text(
        "import triton_python_backend_utils as pb_utils\n"
        "\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]\n",
        encoding="utf-8",
    )
    script = f"""
import importlib.util
try:
    import triton_python_backend_utils
except ImportError:
    pass
else:
    raise SystemExit("triton_python_backend_utils is importable on its own")
import sluice.gpu_workers.backends.python.backend
from sluice.gpu_workers.backends.python import pb_utils
spec = importlib.util.spec_from_file_location("user_model", {str(model)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert module.pb_utils is pb_utils, module.pb_utils
print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
