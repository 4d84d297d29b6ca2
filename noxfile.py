"""One isolated session per distribution, plus packaging, integration, lint and the demo.

    nox                 # everything CI runs
    nox -s core         # one distribution's tests
    nox -l              # list sessions

Every session installs the pinned CPU torch first: an unpinned torch (or a package that
pulls one) would download a multi-GB CUDA build.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
TORCH = os.environ.get("VEOMNI_TORCH_SPEC", "torch==2.13.0")
TEST_DEPS = ["pytest>=8", "transformers>=5.0"]
PLUGINS = sorted(p.parent.name for p in (ROOT / "plugins").glob("*/pyproject.toml"))

nox.options.sessions = ["lint", "core", "plugin", "template", "packaging", "integration", "demo"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False


def _base(session: nox.Session) -> None:
    session.install(TORCH)
    session.install("-e", "core", *TEST_DEPS)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def core(session: nox.Session) -> None:
    """The core alone: no plugin installed."""
    _base(session)
    session.run("pytest", "core/tests", "-q", *session.posargs)


@nox.session
@nox.parametrize("name", PLUGINS)
def plugin(session: nox.Session, name: str) -> None:
    """One plugin distribution with only the core beside it; Triton kernels run on the CPU interpreter."""
    _base(session)
    session.install("-e", f"plugins/{name}")
    session.run("pytest", f"plugins/{name}/tests", "-q", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session
def template(session: nox.Session) -> None:
    """The third-party backend template: build its wheel, install it beside the core, test and check it."""
    _base(session)
    session.install("build", "wheel")
    session.run("bash", "examples/backend-template/ci.sh", external=True,
                env={"PYTHON": os.path.join(session.bin, "python")})


@nox.session
def packaging(session: nox.Session) -> None:
    """Build every wheel, install them into a fresh environment, discover them via entry points."""
    session.install(TORCH)
    session.install("-e", "core", "pytest>=8", "build", "wheel")
    session.run("pytest", "tests/packaging", "-q", "-m", "packaging", *session.posargs)


@nox.session
def integration(session: nox.Session) -> None:
    """Every distribution together: models, binding, cross-package behaviour."""
    _base(session)
    for name in PLUGINS:
        session.install("-e", f"plugins/{name}")
    session.run("pytest", "tests", "-q", "-m", "not packaging", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session
def demo(session: nox.Session) -> None:
    """The main job, as the README runs it."""
    _base(session)
    session.run("veomni-ops", "train", "examples/qwen3-tiny-auto.yaml", "--compare", "examples/qwen3-tiny-eager.yaml")
