"""The backend template's ``ci.sh`` in an environment it must not change: where the template's
distribution is installed already, ci.sh stops before any work, names every missing piece
with its install line, and leaves the installed one in place (it uninstalled a backend the
user had installed: its exit trap removed whatever held the name). The whole path of ci.sh
(build, install, test, check, uninstall) runs in the ``template`` session.

A venv of its own, with no torch: the core and the template go in as wheels built from this
checkout, without dependencies (ci.sh's checks read what is installed; they import nothing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "examples" / "backend-template"


def _env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VEOMNI_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "PYTHONNOUSERSITE": "1", "VIRTUAL_ENV": str(venv),
            "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}


def _run(cmd: list, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _wheel(src: Path, stage: Path, out: Path, stem: str) -> Path:
    """The wheel ``stem-*.whl`` of ``src``, built from a copy (no build litter in the checkout), offline."""
    copy = stage / src.name
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--wheel-dir", out, copy])
    (wheel,) = out.glob(f"{stem}-*.whl")
    return wheel


def test_ci_sh_leaves_an_installed_template_alone_and_names_what_is_missing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])
    py, env = venv / "bin" / "python", _env(venv)
    stage, wheels = tmp_path / "stage", tmp_path / "wheels"
    stage.mkdir()
    template = _wheel(TEMPLATE.resolve(), stage, wheels, "veomni_backend_template")
    core = _wheel(REPO / "core", stage, wheels, "veomni_ops")
    _run([py, "-m", "pip", "install", "-q", "--no-deps", core, template], env)
    assert "pytest" not in _run([py, "-m", "pip", "list"], env).stdout.lower()

    proc = subprocess.run(["bash", TEMPLATE / "ci.sh"], env={**env, "PYTHON": str(py)}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr
    assert f"ci.sh: pytest is not installed for {py}: {py} -m pip install 'pytest>=8'" in err, err
    assert f"ci.sh: veomni-backend-template 0.1.0 is installed for {py} already" in err, err
    assert f"uninstall it first: {py} -m pip uninstall veomni-backend-template" in err, err
    assert "== build the wheel" not in proc.stdout  # stopped before any work
    shown = _run([py, "-m", "pip", "show", "veomni-backend-template"], env).stdout
    assert "Version: 0.1.0" in shown, shown  # still installed: ci.sh did not install it, so it leaves it


def test_new_backend_writes_the_template_the_core_wheel_ships(pkg, tmp_path: Path) -> None:
    """From an installed wheel (package data, not the checkout): every file of the template, renamed."""
    out = tmp_path / "veomni-backend-mine"
    proc = pkg.cli("new-backend", "mine", str(out))
    assert proc.returncode == 0, proc.stderr
    expected = {str(p.relative_to(TEMPLATE)).replace("template", "mine") for p in TEMPLATE.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
    assert {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} == expected
    assert 'name = "veomni-backend-mine"' in (out / "pyproject.toml").read_text()
