"""The transformers releases binding supports, and the check ``apply`` runs first.

The range is the one ``core/pyproject.toml`` declares for the ``models`` extra; CI tests
binding on its oldest release and on the newest release on PyPI (``nox -s binding``), and
``constraints.txt`` pins the release the other sessions and ``./dev demo`` install. A new
transformers release that breaks binding is seen by that newest-release session first.

Outside the range ``apply`` refuses with the version, the range and the command that fixes
it. ``VEOMNI_OPS_ALLOW_TRANSFORMERS=<version>`` turns the refusal for exactly that installed
version into a warning (how CI tries a release newer than the range, and how a user can).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

#: Oldest supported release (inclusive) and the first release not yet supported (exclusive).
#: Keep in step with ``core/pyproject.toml`` (a test checks that they agree).
MIN_TRANSFORMERS = "5.17.0"
BELOW_TRANSFORMERS = "5.25"
SUPPORTED = f">={MIN_TRANSFORMERS},<{BELOW_TRANSFORMERS}"
ALLOW_ENV = "VEOMNI_OPS_ALLOW_TRANSFORMERS"


class UnsupportedTransformersError(RuntimeError):
    """The installed transformers is outside the range binding supports."""


def installed_transformers() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__


def describe_support() -> str:
    return f"transformers {installed_transformers()} is installed; veomni-ops supports transformers{SUPPORTED}"


def support_problem(version: str | None) -> str | None:
    """Why ``version`` is outside the supported range, or ``None``."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if version is None:
        return "transformers is not installed"
    if SpecifierSet(SUPPORTED).contains(Version(version), prereleases=True):
        return None
    newer = Version(version) >= Version(BELOW_TRANSFORMERS)
    return (f"transformers {version} is {'newer' if newer else 'older'} than the range veomni-ops supports "
            f"(transformers{SUPPORTED})")


def check_transformers(model_cls: type | None = None, version: str | None = None,
                       env: Mapping[str, str] | None = None) -> None:
    """Raise :class:`UnsupportedTransformersError` if the installed transformers is outside the range."""
    version = version or installed_transformers()
    why = support_problem(version)
    if why is None:
        return
    env = os.environ if env is None else env
    what = f"cannot bind {model_cls.__name__}: " if model_cls is not None else ""
    fix = f'pip install "transformers{SUPPORTED}"'
    if version is not None and env.get(ALLOW_ENV, "").strip() == version:
        warnings.warn(f"{what}{why}; binding anyway because {ALLOW_ENV}={version}. If binding or the first forward "
                      f"fails, {fix}.", RuntimeWarning, stacklevel=3)
        return
    raise UnsupportedTransformersError(
        f"{what}{why}. Fix: {fix} (the release CI tested together with this veomni-ops is in its "
        f"constraints.txt), or set {ALLOW_ENV}={version} to try this release anyway."
    )
