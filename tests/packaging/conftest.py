"""A fresh virtual environment with real wheels installed, built once per test session.

What goes in, in this order:

1. ``torch==2.13.0`` (pinned: an unpinned torch would pull a multi-GB CUDA build), from the
   machine's local wheel cache and indexes when they exist (``/opt/wheels``,
   ``/opt/pypi/simple``, ``/opt/pypi-more/simple``), else from pip's configured index. No
   numpy: the core requires it, and brings it.
2. Wheels built from this checkout: the core (``core/``) and every fault-injection
   distribution in ``tests/fixtures/dists/``.
3. Every real plugin ``plugins/veomni-*/`` present at test time, each with its
   dependencies if they can be had from the same indexes, else ``--no-deps`` (recorded in
   :attr:`PackagingEnv.install_notes`, printed by the tests). A plugin's spec module must
   load without its vendor library, so discovery is still tested in full.

Sources are copied to a temporary directory before building so that setuptools' ``build/``
and ``*.egg-info`` never land in the checkout. Every command in the venv runs with a
scrubbed environment: no ``PYTHONPATH`` (which would shadow the installed wheel with the
checkout), no ``VEOMNI_*`` switch, no user site.

Environment knobs (for people iterating on these tests; CI sets none):

``VEOMNI_TEST_VENV``         reuse this venv directory across sessions (created if missing);
                             our distributions are uninstalled and reinstalled every session,
                             torch is kept.
``VEOMNI_TEST_TORCH``        the torch requirement to install (default ``torch==2.13.0``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE_DIR = REPO / "core"
FIXTURE_DISTS = REPO / "tests" / "fixtures" / "dists"
PLUGINS_DIR = REPO / "plugins"

TORCH_REQ = os.environ.get("VEOMNI_TEST_TORCH", "torch==2.13.0")

#: Fault-injection distributions: directory name == distribution name.
FIXTURES = (
    "vo-good-backend",
    "vo-broken-import",
    "vo-raising-hook",
    "vo-misspelt-hook",
    "vo-duplicate",
    "vo-wrong-device",
    "vo-invalid-spec",
    "vo-future-api",
    "vo-squatter",
    "vo-broken-kernel",
)

_IGNORE = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".nox", "*.pyc")


def _pip_index_args() -> list[str]:
    """Offline sources when this machine has them: deterministic and no network needed."""
    args: list[str] = []
    simple = [p for p in ("/opt/pypi/simple", "/opt/pypi-more/simple") if os.path.isdir(p)]
    if simple:
        args += ["--index-url", f"file://{simple[0]}"]
        for extra in simple[1:]:
            args += ["--extra-index-url", f"file://{extra}"]
    if os.path.isdir("/opt/wheels"):
        args += ["--find-links", "/opt/wheels"]
    return args


def clean_env(extra: Mapping[str, str] | None = None, venv: Path | None = None) -> dict[str, str]:
    """The caller's environment minus everything that could leak the checkout or a switch in."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("VEOMNI_")
        and k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "USE_GROUP_GEMM", "TRITON_INTERPRET")
    }
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra or {})
    return env


def _run(cmd: Sequence[str | os.PathLike], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


@dataclass
class PackagingEnv:
    venv: Path
    wheels: Path
    workdir: Path
    #: distribution name -> how it was installed ("wheel + deps", "--no-deps: <why>")
    install_notes: dict[str, str] = field(default_factory=dict)
    #: distribution names of the real plugins found in plugins/
    real_plugins: tuple[str, ...] = ()
    has_reference: bool = False

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def cli_path(self) -> Path:
        return self.venv / "bin" / "veomni-ops"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return clean_env(extra, self.venv)

    def run(self, cmd: Sequence[str | os.PathLike], env: Mapping[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        """Run ``cmd`` in the venv's environment from a scratch directory (not the checkout)."""
        return subprocess.run([str(c) for c in cmd], cwd=self.workdir, env=self.env(env), capture_output=True,
                              text=True, timeout=timeout)

    def cli(self, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
        return self.run([self.cli_path, *args], env=env)

    def py(self, code: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
        return self.run([self.python, "-c", textwrap.dedent(code)], env=env)

    def py_json(self, code: str, env: Mapping[str, str] | None = None):
        """Run ``code``, which prints one JSON document as its last stdout line; return it."""
        proc = self.py(code, env)
        if proc.returncode != 0:
            raise AssertionError(f"snippet failed ({proc.returncode}):\n{proc.stderr[-4000:]}\n{code}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def write(self, name: str, text: str) -> Path:
        path = self.workdir / name
        path.write_text(textwrap.dedent(text).lstrip())
        return path


def _build_wheel(src: Path, stage: Path, wheels: Path) -> None:
    """Build ``src`` into ``wheels`` from a copy of it (keeps build litter out of the checkout)."""
    copy = stage / src.name
    shutil.copytree(src, copy, ignore=_IGNORE)
    # No build isolation: the running interpreter's setuptools builds; nothing is downloaded.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "--wheel-dir", wheels, copy], env=clean_env())


def _wheel_for(wheels: Path, dist: str) -> Path:
    stem = dist.replace("-", "_")
    found = sorted(wheels.glob(f"{stem}-*.whl"))
    if len(found) != 1:
        raise RuntimeError(f"expected one wheel for {dist} in {wheels}, found {[p.name for p in found]}")
    return found[0]


def _project_name(pyproject: Path) -> str:
    import tomllib

    return tomllib.loads(pyproject.read_text())["project"]["name"]


def _make_base_venv(venv: Path) -> subprocess.Popen | None:
    """Create the venv and start installing torch in the background; ``None`` if reused as is."""
    python = venv / "bin" / "python"
    if python.exists():
        check = subprocess.run([python, "-c", "import torch"], env=clean_env(venv=venv), capture_output=True)
        if check.returncode == 0:
            return None
    else:
        _run([sys.executable, "-m", "venv", venv], env=clean_env())
    cmd = [python, "-m", "pip", "install", "-q", *_pip_index_args(), TORCH_REQ]
    return subprocess.Popen([str(c) for c in cmd], env=clean_env(venv=venv), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="session")
def pkg(tmp_path_factory: pytest.TempPathFactory) -> PackagingEnv:
    base = tmp_path_factory.mktemp("packaging")
    venv = Path(os.environ["VEOMNI_TEST_VENV"]) if os.environ.get("VEOMNI_TEST_VENV") else base / "venv"
    wheels, stage, work = base / "wheels", base / "src", base / "work"
    for d in (wheels, stage, work):
        d.mkdir()
    env = PackagingEnv(venv=venv, wheels=wheels, workdir=work)

    # torch installs (~30 s) while the wheels build.
    torch_install = _make_base_venv(venv)
    _build_wheel(CORE_DIR, stage, wheels)
    for name in FIXTURES:
        _build_wheel(FIXTURE_DISTS / name, stage, wheels)
    plugin_dirs = sorted(p.parent for p in PLUGINS_DIR.glob("veomni-*/pyproject.toml"))
    real = []
    for d in plugin_dirs:
        _build_wheel(d, stage, wheels)
        real.append(_project_name(d / "pyproject.toml"))
    env.real_plugins = tuple(real)
    if torch_install is not None:
        out, err = torch_install.communicate(timeout=900)
        if torch_install.returncode != 0:
            raise RuntimeError(f"installing {TORCH_REQ} into the test venv failed:\n{err[-4000:]}")

    pip = [env.python, "-m", "pip"]
    venv_env = clean_env(venv=venv)
    # A reused venv: drop whatever we installed last time, so only this session's wheels count.
    listed = json.loads(_run([*pip, "list", "--format", "json"], env=venv_env).stdout)
    ours = [p["name"] for p in listed if p["name"].lower().replace("_", "-").startswith(("veomni-", "vo-"))]
    if ours:
        _run([*pip, "uninstall", "-y", *ours], env=venv_env)

    index = [*_pip_index_args(), "--find-links", str(wheels)]
    core_and_fixtures = [_wheel_for(wheels, "veomni-ops")] + [_wheel_for(wheels, n) for n in FIXTURES]
    _run([*pip, "install", "-q", *index, *core_and_fixtures], env=venv_env)
    env.install_notes["veomni-ops"] = "wheel + deps"
    for n in FIXTURES:
        env.install_notes[n] = "wheel + deps"
    for dist in real:
        whl = _wheel_for(wheels, dist)
        try:
            _run([*pip, "install", "-q", *index, whl], env=venv_env)
            env.install_notes[dist] = "wheel + deps"
        except RuntimeError as e:
            # Its vendor library is not in the offline indexes: the plugin goes in alone. Its
            # light spec module must still load (that is the point of the light/heavy split).
            last = [ln for ln in str(e).splitlines() if "ERROR" in ln][-1:] or ["pip failed"]
            _run([*pip, "install", "-q", "--no-deps", whl], env=venv_env)
            env.install_notes[dist] = f"--no-deps (dependencies not installable offline: {last[0].strip()})"

    probe = env.py_json(
        """
        import importlib.util, json
        print(json.dumps(importlib.util.find_spec("veomni_ops.backends.reference") is not None))
        """
    )
    env.has_reference = bool(probe)
    print("\npackaging venv:", venv)
    for dist, how in env.install_notes.items():
        print(f"  {dist}: {how}")
    return env


@pytest.fixture
def needs_reference(pkg: PackagingEnv) -> None:
    """Skip a test that needs the core's ``eager`` reference backend in the installed wheel."""
    if not pkg.has_reference:
        pytest.skip(
            "veomni_ops.backends.reference is missing from the installed veomni-ops wheel (the core's eager "
            "entry point cannot load yet); this test resolves ops that only the reference backend provides"
        )
