"""The install path of a checkout (issue 25): ``./dev wheels`` builds every distribution (the
core and each plugin) into one folder, and ``pip install --find-links DIR
"veomni-ops[liger,triton]"`` resolves the core's extras to those wheels, their vendor libraries
(liger-kernel, triton) from pip's configured indexes, as a user's pip would. The plugins are on
no index yet: without ``--find-links`` the extras cannot resolve.

Nothing here uses ``--no-deps``: liger-kernel and triton install for real (under
constraints.txt, torch pinned first), so this needs the indexes pip is configured with (CI's
machine has them). About two minutes on 2 CPU cores: a fresh venv gets torch, triton and
liger-kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "constraints.txt"
TORCH_REQ = os.environ.get("VEOMNI_TEST_TORCH", "torch==2.13.0")
PLUGIN_DIRS = sorted(p.parent for p in (REPO / "plugins").glob("veomni-*/pyproject.toml"))


def _env(venv: Path | None = None) -> dict[str, str]:
    """This environment without what would leak the checkout or a switch in (as conftest.clean_env)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VEOMNI_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "TRITON_INTERPRET")}
    env["PYTHONNOUSERSITE"] = "1"
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(cmd: list, env: dict[str, str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-3000:]}")
    return proc


def _project(pyproject: Path) -> tuple[str, str]:
    meta = tomllib.loads(pyproject.read_text())["project"]
    return meta["name"], meta["version"]


def _wheel_metadata(wheel: Path) -> str:
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return z.read(name).decode()


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``./dev wheels DIR`` as a user runs it, with a build venv of its own (setuptools, wheel)."""
    base = tmp_path_factory.mktemp("dev-wheels")
    out = base / "dist"
    env = {**_env(), "VEOMNI_DEV_VENV": str(base / "build-venv")}
    proc = _run(["bash", REPO / "dev", "wheels", out], env, cwd=base)
    print(proc.stderr)
    return out


def test_dev_wheels_builds_every_distribution(dist: Path) -> None:
    built = {w.name.split("-")[0]: w.name.split("-")[1] for w in dist.glob("*.whl")}
    expected = dict(_project(d / "pyproject.toml") for d in [REPO / "core", *PLUGIN_DIRS])
    assert built == {name.replace("-", "_"): version for name, version in expected.items()}, (built, expected)


def test_the_core_extras_name_every_plugin_wheel_at_its_version(dist: Path) -> None:
    """Each plugin's extra (``liger`` for veomni-liger) and ``all`` require exactly the version
    of the plugin wheel built beside the core; no extra names one that was not built."""
    (core,) = dist.glob("veomni_ops-*.whl")
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in _wheel_metadata(core).splitlines()
            if line.startswith("Requires-Dist:")]
    plugins = dict(_project(d / "pyproject.toml") for d in PLUGIN_DIRS)
    ours = [r for r in reqs if r.name.startswith("veomni-")]
    by_extra: dict[str, set[str]] = {}
    for r in ours:
        assert r.marker is not None and r.name in plugins, f"{r} names no plugin of this checkout"
        assert str(r.specifier) == f"=={plugins[r.name]}", f"{r}: the plugin is version {plugins[r.name]}"
        extra = str(r.marker).split('"')[1]
        by_extra.setdefault(extra, set()).add(r.name)
    for name in plugins:
        assert by_extra.get(name.removeprefix("veomni-")) == {name}, (name, by_extra)
    assert by_extra["all"] == set(plugins)


def test_find_links_install_resolves_the_extras_to_these_wheels(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], _env(), cwd=tmp_path)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "-c", CONSTRAINTS]
    env = _env(venv)
    _run([*pip, TORCH_REQ], env, cwd=tmp_path)  # first and pinned: no CUDA build pulled in by a dependency
    _run([*pip, "--find-links", dist, "veomni-ops[liger,triton]"], env, cwd=tmp_path)
    listed = json.loads(_run([venv / "bin" / "python", "-m", "pip", "list", "--format", "json"], env,
                             cwd=tmp_path).stdout)
    have = {p["name"].lower().replace("_", "-"): p["version"] for p in listed}
    for name, version in (_project(d / "pyproject.toml") for d in [REPO / "core", *PLUGIN_DIRS]):
        wanted = name in ("veomni-ops", "veomni-liger", "veomni-triton")
        assert (have.get(name) == version) if wanted else name not in have, (name, have.get(name))
    assert "liger-kernel" in have and "triton" in have, have
    # From these wheels, not from an index that might hold the same names: the files are this checkout's.
    out = json.loads(_run([venv / "bin" / "python", "-c",
                           "import json, veomni_liger.specs as a, veomni_triton.specs as b; "
                           "print(json.dumps([a.__file__, b.__file__]))"], env, cwd=tmp_path).stdout)
    for installed, plugin in zip(out, ("veomni-liger", "veomni-triton")):
        package = plugin.replace("-", "_")
        assert Path(installed).read_bytes() == (REPO / "plugins" / plugin / "src" / package / "specs.py").read_bytes()
    plugins = json.loads(_run([venv / "bin" / "veomni-ops", "plugins", "--json"], env, cwd=tmp_path).stdout)
    loaded = {(p["distribution"], p["status"]) for p in plugins["plugins"]}
    assert {("veomni-ops", "loaded"), ("veomni-liger", "loaded"), ("veomni-triton", "loaded")} <= loaded, loaded
