"""One isolated session per distribution, plus packaging, integration, lint and the demo.

    nox                 # everything CI runs
    nox -s core         # one distribution's tests
    nox -l              # list sessions

Every session installs the pinned CPU torch first: an unpinned torch (or a package that
pulls one) would download a multi-GB CUDA build.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CI_TORCH = "torch==2.13.0"
TORCH = os.environ.get("VEOMNI_TORCH_SPEC", CI_TORCH)


def _constraints_file() -> Path:
    """constraints.txt, the versions tested together (with CI's CPU torch). For another torch
    (``VEOMNI_TORCH_SPEC``, a CUDA build) a copy without the triton pin, which such a build meets
    with a pin of its own (pip met the clash by installing another torch, silently), and with
    that torch pinned, so that no install in a session can replace it."""
    tested = ROOT / "constraints.txt"
    if TORCH == CI_TORCH:
        return tested
    kept = [line for line in tested.read_text().splitlines()
            if not re.match(r"(?i)(triton|torch)\s*==", line)]
    out = ROOT / ".nox" / "constraints-for-VEOMNI_TORCH_SPEC.txt"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join([*kept, TORCH if TORCH.startswith("torch==") else ""]) + "\n")
    return out


#: Versions tested together; every session but binding(newest) installs under them.
CONSTRAINTS = ("-c", str(_constraints_file()))
PLUGINS = sorted(p.parent.name for p in (ROOT / "plugins").glob("*/pyproject.toml"))


def _transformers_range() -> tuple[str, str]:
    """(oldest supported release, first unsupported) from the core's binding module."""
    text = (ROOT / "core/src/veomni_ops/binding/versions.py").read_text()
    found = dict(re.findall(r'^(MIN_TRANSFORMERS|BELOW_TRANSFORMERS) = "([^"]+)"', text, re.M))
    return found["MIN_TRANSFORMERS"], found["BELOW_TRANSFORMERS"]


MIN_TRANSFORMERS, BELOW_TRANSFORMERS = _transformers_range()
TEST_DEPS = ["pytest>=8", f"transformers>={MIN_TRANSFORMERS},<{BELOW_TRANSFORMERS}"]

nox.options.sessions = ["lint", "core", "core_optional", "plugin", "template", "packaging", "integration",
                        "binding", "clients", "veomni", "gpu_image_torch", "docs", "demo"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False


#: Set by ``./dev test`` when the disk cannot hold every session's venv at once (about 36 GB, a
#: torch in each): then each session's venv is removed once the session has run.
PRUNE_VENVS = os.environ.get("VEOMNI_PRUNE_VENVS") == "1"


def _venv_removed_after(fn: Callable[..., None]) -> Callable[..., None]:
    """``fn``, followed (pass or fail) by the removal of the session's venv when PRUNE_VENVS is set."""
    @functools.wraps(fn)
    def run(session: nox.Session, *args: object, **kwargs: object) -> None:
        try:
            fn(session, *args, **kwargs)
        finally:
            location = getattr(session.virtualenv, "location", None)
            if PRUNE_VENVS and location and Path(location).is_dir():
                shutil.rmtree(location, ignore_errors=True)
                session.log(f"removed {location} (VEOMNI_PRUNE_VENVS=1: the disk cannot hold every venv)")
    return run


def _session(fn: Callable[..., None]) -> Callable[..., None]:
    """``@nox.session`` for a session CI runs: its venv is removed once it has run, under PRUNE_VENVS
    (under ``@nox.parametrize`` too: functools.wraps carries the parameters over)."""
    return nox.session(_venv_removed_after(fn))


def _base(session: nox.Session) -> None:
    session.install(TORCH)
    session.install(*CONSTRAINTS, "-e", "core", *TEST_DEPS)


@_session
def lint(session: nox.Session) -> None:
    """ruff (ruff.toml), then mypy (mypy.ini: the core's and every plugin's sources), then the
    import-graph check (tools/import_graph.py: no import cycle in core/src, typing-only ones
    included, and no import of an op's heavy module from below ops/) and its own tests, the
    op-mention bound (tools/op_mentions.py: no op named in more than 6 core modules outside its
    folder) and its tests, the size bound of the core's modules (tools/test_core_size.py), and the
    tests of the benchmark scripts that run without a GPU (tools/test_scaling_model.py:
    benchmarks/scaling_model.py, docs/scaling.md; tools/test_step_memory.py: the snapshot analysis
    of benchmarks/gpu/step_memory.py): every tools/test_*.py. mypy reads the types of what they import, so the core and every plugin are installed beside it."""
    session.install(TORCH)
    session.install(*CONSTRAINTS, "ruff>=0.6", "mypy", "-e", "core", *TEST_DEPS,
                    *(a for name in PLUGINS for a in ("-e", f"plugins/{name}")))
    session.run("ruff", "check", ".")
    session.run("mypy")
    session.run("python", "tools/import_graph.py", "core/src")
    session.run("python", "tools/op_mentions.py", "core/src", "--max", "6")
    session.run("pytest", "tools", "-q")  # every tools/test_*.py, so none is left out


@_session
def core(session: nox.Session) -> None:
    """The core alone: no plugin installed."""
    _base(session)
    session.run("pytest", "core/tests", "-q", *session.posargs)


#: The core's tests that need what the core session does not install, and what each needs
#: (pinned in constraints.txt). Here a skip is a failure (VEOMNI_OPS_TEST_NO_SKIP=1).
CORE_OPTIONAL = {
    "core/tests/test_bench_peers.py::test_liger_peer_runs_the_model_layout_in_place_and_matches_eager":
        "liger-kernel",  # the bench's Liger peer row, under the Triton interpreter on the CPU
    "core/tests/test_train.py::test_plot_writes_a_png": "matplotlib",
    "core/tests/test_bench.py::test_render_from_saved_and_plot_switch": "matplotlib",
    "core/tests/test_kernels_compile.py::test_inductor_rms_norm_and_swiglu": "",  # inductor's C++ codegen (gcc)
}


@_session
def core_optional(session: nox.Session) -> None:
    """The core's tests whose dependency or switch the core session lacks: the bench's Liger peer
    row (liger-kernel), the --plot tests (matplotlib), the inductor compile test
    (VEOMNI_OPS_TEST_INDUCTOR=1). No plugin is installed; a skip fails the session."""
    _base(session)
    session.install(*CONSTRAINTS, *sorted({dep for dep in CORE_OPTIONAL.values() if dep}))
    session.run("pytest", *CORE_OPTIONAL, "-q", "-rs", *session.posargs,
                env={"VEOMNI_OPS_TEST_INDUCTOR": "1", "VEOMNI_OPS_TEST_NO_SKIP": "1"})


#: The GPU image's versions (the device machines': torch 2.11, which pulls triton 3.6, and
#: transformers 5.17, the oldest supported). Its dynamo traced the Ulysses exchange's autograd
#: Function so that no gradient crossed it under train.compile, where torch 2.13 (every other
#: session's) does not. Its PyPI build is a CUDA one (some GB with its NVIDIA libraries); it runs
#: these tests on the CPU.
GPU_IMAGE_TORCH = "torch==2.11.0"


@_session
def gpu_image_torch(session: nox.Session) -> None:
    """What traces our code on the GPU image's torch: the layouts' tests (real gloo processes
    against one process: eager, under train.compile with aot_eager, checkpoints and resuming),
    compile mode, and compiled bound models. Not under constraints.txt: its triton pin is one that
    torch 2.11 cannot take, and pip met it by swapping torch 2.11 for 2.13, silently."""
    session.install(GPU_IMAGE_TORCH)
    session.install("-e", "core", "pytest>=8", f"transformers=={MIN_TRANSFORMERS}")
    got = session.run("python", "-c", "import torch; print(torch.__version__)", silent=True).strip().splitlines()[-1]
    if got.split("+")[0] != GPU_IMAGE_TORCH.split("==")[1]:
        session.error(f"torch {got} installed, not the GPU image's {GPU_IMAGE_TORCH}")
    session.run("pytest", "core/tests/test_parallel.py", "core/tests/test_checkpoint.py",
                "core/tests/test_checkpoint_faults.py", "core/tests/test_compile_mode.py",
                "core/tests/test_kernels_compile.py", "tests/models/test_models_compile.py", "-q", *session.posargs)


@_session
@nox.parametrize("name", PLUGINS)
def plugin(session: nox.Session, name: str) -> None:
    """One plugin distribution with only the core beside it; Triton kernels run on the CPU interpreter."""
    _base(session)
    session.install(*CONSTRAINTS, "-e", f"plugins/{name}")
    session.run("pytest", f"plugins/{name}/tests", "-q", *session.posargs, env={"TRITON_INTERPRET": "1"})


@_session
def template(session: nox.Session) -> None:
    """The third-party backend template: build its wheel, install it beside the core, test and check it
    (examples/backend-template/ci.sh, which uninstalls it after); then the same for the copy
    `veomni-ops new-backend` writes (every name changed: its own ci.sh, its own tests)."""
    _base(session)
    session.install(*CONSTRAINTS, "build", "wheel", "setuptools>=77")
    python = {"PYTHON": os.path.join(session.bin, "python")}
    session.run("bash", "examples/backend-template/ci.sh", external=True, env=python)
    copy = Path(session.create_tmp()) / "veomni-backend-my-fast"
    shutil.rmtree(copy, ignore_errors=True)  # new-backend writes only into an absent or empty folder
    session.run("veomni-ops", "new-backend", "my_fast", str(copy))
    session.run("bash", str(copy / "ci.sh"), external=True, env=python)


@_session
def packaging(session: nox.Session) -> None:
    """Build every wheel, install them into a fresh environment, discover them via entry points; and
    the install of README.md's "Use" block as written, in a fresh venv: ./dev wheels, its torch line, then
    pip install --find-links dist "veomni-ops[...]", which must keep that torch (and warn nothing of numpy)."""
    session.install(TORCH)
    # setuptools >= 77 reads the SPDX license form; the wheels are built with it, without isolation.
    session.install(*CONSTRAINTS, "-e", "core", "pytest>=8", "build", "wheel", "setuptools>=77")
    session.run("pytest", "tests/packaging", "-q", "-m", "packaging", *session.posargs)


@_session
def integration(session: nox.Session) -> None:
    """Every distribution together: models, binding, cross-package behaviour (the client tests,
    which need peft and accelerate, run in the clients session; README's blocks in the docs session)."""
    _base(session)
    session.install(*CONSTRAINTS, *(a for name in PLUGINS for a in ("-e", f"plugins/{name}")))
    session.run("pytest", "tests", "-q", "-m", "not packaging", "--ignore=tests/clients", "--ignore=tests/docs",
                *session.posargs, env={"TRITON_INTERPRET": "1"})


def _pinned(name: str) -> str:
    """``name==version`` as constraints.txt pins it (for sessions that cannot take the whole file)."""
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.split("==")[0].strip().lower() == name:
            return line.strip()
    raise LookupError(f"constraints.txt pins no {name}")


def _transformers_at(session: nox.Session, transformers: str, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """Install the core, every plugin, pytest and ``extra`` on the oldest supported transformers
    (``extra`` as constraints.txt pins them) or on the newest releases on PyPI (transformers and
    ``extra`` upgraded, unconstrained: a new release that breaks binding shows here first).
    Returns the environment the tests run in."""
    session.install(TORCH)
    plugins = [a for name in PLUGINS for a in ("-e", f"plugins/{name}")]
    if transformers == "oldest":
        # Not under constraints.txt, which pins the newest tested release: transformers and what it needs.
        session.install("-e", "core", *plugins, "pytest>=8", f"transformers=={MIN_TRANSFORMERS}",
                        *(_pinned(name) for name in extra))
    else:
        session.install("-e", "core", *plugins, "pytest>=8", *extra)
        session.install("--upgrade", "transformers", *extra)
    version = session.run("python", "-c", "import transformers; print(transformers.__version__)",
                          silent=True).strip().splitlines()[-1]
    session.log(f"transformers {version} ({transformers}; supported >={MIN_TRANSFORMERS},<{BELOW_TRANSFORMERS})")
    # A release newer than the range: test it anyway (the refusal a user would get is tested in core).
    return {"TRITON_INTERPRET": "1", "VEOMNI_OPS_ALLOW_TRANSFORMERS": version}


@_session
@nox.parametrize("transformers", ["oldest", "newest"])
def binding(session: nox.Session, transformers: str) -> None:
    """Binding into every model family on the oldest supported transformers and on the newest
    release on PyPI (unconstrained: a new release that breaks binding shows here first)."""
    env = _transformers_at(session, transformers)
    session.run("pytest", "tests/models", "-q", *session.posargs, env=env)


@_session
@nox.parametrize("transformers", ["oldest", "newest"])
def clients(session: nox.Session, transformers: str) -> None:
    """What users train a bound model in (Trainer, PEFT, accelerate, TRL's SFTTrainer with packed rows,
    generate, gradient checkpointing, torch.compile, their own FSDP2 loop), bound vs unbound, on the oldest
    supported transformers (peft, accelerate and trl as constraints.txt pins them: trl 1.16.0 runs with
    transformers 5.17.0 and 5.24.0) and on the newest releases."""
    env = _transformers_at(session, transformers, extra=("peft", "accelerate", "trl"))
    session.run("pytest", "tests/clients", "-q", *session.posargs, env=env)


#: VeOmni from the package index, as a client (tests/veomni_client): the release tested, and the
#: transformers release it imports against (0.1.12 imports a class transformers 5.24 removed).
VEOMNI = "veomni==0.1.12"
VEOMNI_TRANSFORMERS = "transformers==5.17.0"


@_session
def veomni(session: nox.Session) -> None:
    """VeOmni's own model builder as a client, in an environment of its own (importing VeOmni
    patches transformers for the whole process). VeOmni is installed without its dependencies
    (it pins a CUDA torch and packaging<26); what it imports on the CPU is installed beside it."""
    session.install(TORCH)
    session.install("-e", "core", "pytest>=8", "psutil", VEOMNI_TRANSFORMERS)
    session.install("--no-deps", VEOMNI)
    session.run("pytest", "tests/veomni_client", "-q", *session.posargs)


@nox.session(default=False)
def constraints(session: nox.Session) -> None:
    """Rewrite constraints.txt: the newest releases in range of everything, if the tests pass on them."""
    session.install(TORCH)
    session.install("-e", "core", *(a for name in PLUGINS for a in ("-e", f"plugins/{name}")), *TEST_DEPS,
                    "peft", "accelerate", "ruff>=0.6", "mypy", "build", "wheel", "matplotlib")
    session.run("pytest", "core/tests", "tests", "-q", "-m", "not packaging", env={"TRITON_INTERPRET": "1"})
    frozen = session.run("python", "-m", "pip", "freeze", "--exclude-editable", silent=True)
    keep = [line for line in frozen.splitlines()
            if line and not line.startswith(("torch==", "-e", "pip==", "setuptools==")) and "@ file" not in line]
    head = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("#")]
    (ROOT / "constraints.txt").write_text("\n".join(head + keep) + "\n")
    session.log(f"wrote {len(keep)} pins to constraints.txt; run ./dev test before committing it")


#: What README's "Use" installs besides the core and transformers: the plugins of its install line.
README_PLUGINS = ("veomni-liger", "veomni-triton")


@_session
def docs(session: nox.Session) -> None:
    """Every code block of README.md as a new user runs it (tests/docs): its commands, its Python,
    its job YAML, in the README's set-up: the core with transformers, the plugins of its install
    line (from this checkout) and accelerate, which transformers' Trainer needs. No
    TRITON_INTERPRET: on a CPU the Triton kernels are unusable, as they are for a user there."""
    _base(session)
    session.install(*CONSTRAINTS, *(a for name in README_PLUGINS for a in ("-e", f"plugins/{name}")), "accelerate")
    session.run("pytest", "tests/docs", "-q", *session.posargs)


@_session
def demo(session: nox.Session) -> None:
    """The main job, as the README runs it."""
    _base(session)
    session.run("veomni-ops", "train", "examples/qwen3-tiny-auto.yaml", "--compare", "examples/qwen3-tiny-eager.yaml")
