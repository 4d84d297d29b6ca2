"""The install path of a checkout (issue 25), as README.md's "Use" block writes it: ``./dev
wheels`` builds every distribution (the core and each plugin) into one folder, then the block's
two ``pip install`` lines run exactly as written, in a fresh venv, beside that folder: the one
that installs torch (pinned: the release CI tests; unpinned, the install pulled the newest
torch, a multi-GB CUDA build CI never tested), then ``pip install --find-links dist
"veomni-ops[...]"``, which resolves the core's extras to those wheels and their vendor
libraries (liger-kernel, triton) from pip's indexes, as a user's pip would, and must keep that
torch. The plugins are on no index yet: without ``--find-links`` the extras cannot resolve.

Which README lines: in the ``## Use`` section, its first ```` ```bash ```` block; of its lines
(split as a shell does, comments dropped), the ``pip install`` ones; the one with
``--find-links`` is the install, and the one before it naming a ``torch==VERSION`` requirement
is the torch line (exactly one of each). Each runs through ``bash -c`` as written.

Nothing here uses ``--no-deps`` or constraints.txt: liger-kernel and triton install for real,
from the indexes pip is configured with (CI's machine has them). About two minutes on 2 CPU
cores: a fresh venv gets torch, triton and liger-kernel.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[2]
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


def readme_install_lines(readme: str) -> tuple[str, str]:
    """(the torch line, the install line) of README.md's "Use" block, as written (module docstring)."""
    section = re.search(r"^## Use\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
    assert section, "README.md has no '## Use' section"
    block = re.search(r"^```bash\n(.*?)^```", section.group(1), re.M | re.S)
    assert block, "README.md's '## Use' section has no ```bash block"
    pips = [(line, argv) for line in block.group(1).splitlines()
            if (argv := shlex.split(line, comments=True))[:2] == ["pip", "install"]]
    installs = [i for i, (_, argv) in enumerate(pips) if "--find-links" in argv]
    assert len(installs) == 1, f"README.md's Use block: not one `pip install --find-links dist ...` line: {pips}"
    torch = [line for line, argv in pips[:installs[0]] if any(a.startswith("torch==") for a in argv)]
    assert len(torch) == 1, ("README.md's Use block must give one `pip install torch==VERSION ...` line before "
                             f"`pip install --find-links dist ...` (which otherwise pulls the newest torch): {pips}")
    return torch[0], pips[installs[0]][0]


def test_readme_install_lines_are_found_and_pin_torch() -> None:
    torch_line, install_line = readme_install_lines((REPO / "README.md").read_text())
    assert re.search(r"(^|\s)torch==\d+\.\d+\.\d+(\s|$)", torch_line), torch_line
    assert shlex.split(install_line, comments=True)[-1].startswith("veomni-ops["), install_line


def test_readme_install_as_written_keeps_its_torch_and_resolves_the_extras_to_these_wheels(dist: Path,
                                                                                          tmp_path: Path) -> None:
    torch_line, install_line = readme_install_lines((REPO / "README.md").read_text())
    pin = next(a for a in shlex.split(torch_line, comments=True) if a.startswith("torch==")).split("==")[1]
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], _env(), cwd=tmp_path)
    env = _env(venv)
    python = venv / "bin" / "python"
    where = dist.parent  # the lines name ./dev wheels' folder as "dist", relative to where they run
    assert dist.name == "dist", dist
    assert _run(["bash", "-c", "command -v pip"], env, cwd=where).stdout.strip() == str(venv / "bin" / "pip")

    def torch_version() -> str:
        return _run([python, "-c", "import torch; print(torch.__version__)"], env, cwd=tmp_path).stdout.strip()

    _run(["bash", "-c", torch_line], env, cwd=where)
    installed = torch_version()
    assert installed.split("+")[0] == pin, f"{torch_line!r} installed torch {installed}"
    _run(["bash", "-c", install_line], env, cwd=where)
    assert torch_version() == installed, f"{install_line!r} replaced torch {installed} with {torch_version()}"

    listed = json.loads(_run([python, "-m", "pip", "list", "--format", "json"], env, cwd=tmp_path).stdout)
    have = {p["name"].lower().replace("_", "-"): p["version"] for p in listed}
    core = tomllib.loads((REPO / "core/pyproject.toml").read_text())["project"]
    extras = Requirement(shlex.split(install_line, comments=True)[-1]).extras
    # every requirement of the extras named (our plugins at this checkout's version, and what they
    # require: liger-kernel, triton), and no other plugin
    wanted = [Requirement(r) for e in sorted(extras) for r in core["optional-dependencies"][e]]
    plugins = dict(_project(d / "pyproject.toml") for d in PLUGIN_DIRS)
    for r in wanted:
        assert r.name in have and r.specifier.contains(have[r.name], prereleases=True), (str(r), have.get(r.name))
        if r.name in plugins:
            for dep in tomllib.loads((REPO / "plugins" / r.name / "pyproject.toml").read_text())["project"][
                    "dependencies"]:
                assert Requirement(dep).name in have, (r.name, dep)
    assert have.get("veomni-ops") == core["version"]
    for name in set(plugins) - {r.name for r in wanted}:
        assert name not in have, (name, have[name])
    # From these wheels, not from an index that might hold the same names: the files are this checkout's.
    ours = sorted(r.name for r in wanted if r.name in plugins)
    out = json.loads(_run([python, "-c", "import importlib, json, sys; print(json.dumps([importlib.import_module("
                           "n.replace('-', '_') + '.specs').__file__ for n in sys.argv[1:]]))", *ours], env,
                          cwd=tmp_path).stdout)
    for installed_file, plugin in zip(out, ours):
        package = plugin.replace("-", "_")
        assert Path(installed_file).read_bytes() == (REPO / "plugins" / plugin / "src" / package / "specs.py").read_bytes()
    proc = _run([venv / "bin" / "veomni-ops", "plugins", "--json"], env, cwd=tmp_path)
    loaded = {(p["distribution"], p["status"]) for p in json.loads(proc.stdout)["plugins"]}
    assert {("veomni-ops", "loaded"), *((name, "loaded") for name in ours)} <= loaded, loaded
    # torch warns "Failed to initialize NumPy" at import where numpy is missing: the core requires it
    assert "numpy" in have and "NumPy" not in proc.stderr, proc.stderr
