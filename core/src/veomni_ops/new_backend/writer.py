"""The names of a new backend, and its copy of the template written with them."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from ..config import AUTO
from ..spec import canonical_distribution

#: What the template calls itself, each form as it appears in its files and paths.
TEMPLATE_DIST = "veomni-backend-template"
TEMPLATE_NAME = "template"
#: Kernel names a backend may not take: what configs write for the choice itself and for the core's reference.
RESERVED = (AUTO, "eager")

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_DIST = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")
#: What is never copied: build and test litter of a template used in place.
_LITTER = ("__pycache__", ".pytest_cache", "build", "dist")


class NewBackendError(ValueError):
    """A name or a folder a new backend cannot have; the message names the fix."""


@dataclass(frozen=True)
class Names:
    """Every name a copy of the template carries, each in the form its place needs."""

    name: str          # the kernel name and entry point: swiglu_mlp_implementation: NAME
    distribution: str  # what pip installs: veomni-backend-NAME
    package: str       # what Python imports: veomni_backend_NAME

    @property
    def camel(self) -> str:
        """``my_fast`` -> ``MyFast`` (the conformance test's class name)."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    def replacements(self) -> list[tuple[str, str]]:
        """(the template's form, this backend's), longest first: each form replaces only itself."""
        return [(TEMPLATE_DIST, self.distribution), (TEMPLATE_DIST.replace("-", "_"), self.package),
                (TEMPLATE_NAME.upper(), self.name.upper()), (TEMPLATE_NAME.capitalize(), self.camel),
                (TEMPLATE_NAME, self.name)]

    def rename(self, text: str) -> str:
        for old, new in self.replacements():
            text = text.replace(old, new)
        return text


def names_for(name: str, distribution: str | None = None) -> Names:
    """The names of a backend whose kernel is called ``name``; every problem in one error."""
    problems = []
    if not _NAME.match(name):
        problems.append(f"NAME {name!r}: a kernel name starts with a lower-case letter and has only lower-case "
                        "letters, digits and '_' (what a config writes: swiglu_mlp_implementation: NAME), e.g. "
                        f"{re.sub(r'[^a-z0-9_]+', '_', name.lower()).strip('_') or 'mine'!r}")
    elif name in RESERVED:
        problems.append(f"NAME {name!r} is reserved ({' and '.join(RESERVED)} are what configs write for the "
                        "choice and for the core's reference kernel); choose your project's name")
    dist = distribution if distribution is not None else f"veomni-backend-{name.replace('_', '-')}"
    if not _DIST.match(dist):
        problems.append(f"--distribution {dist!r}: a distribution name here starts with a lower-case letter and "
                        f"has only lower-case letters, digits and single '-' between them, e.g. "
                        f"{canonical_distribution(dist)!r}")
    elif canonical_distribution(dist) == "veomni-ops":
        problems.append("--distribution veomni-ops is the core's own name; choose your project's")
    if problems:
        raise NewBackendError("; ".join(problems))
    return Names(name, dist, dist.replace("-", "_"))


def template_files() -> Iterator[tuple[str, Traversable]]:
    """(path relative to the template, the file) for every file of the template the core ships."""
    def walk(node: Traversable, rel: str) -> Iterator[tuple[str, Traversable]]:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.name in _LITTER or child.name.endswith((".egg-info", ".pyc")):
                continue
            path = f"{rel}/{child.name}" if rel else child.name
            if child.is_dir():
                yield from walk(child, path)
            else:
                yield path, child

    yield from walk(resources.files(__package__) / "backend-template", "")


def write_backend(names: Names, folder: str | os.PathLike[str]) -> list[Path]:
    """Write the template, renamed for ``names``, into ``folder`` (absent, or an empty folder).
    Returns the files written. Shell scripts stay executable."""
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise NewBackendError(f"{out} exists and is not an empty folder: name another DIR, or remove it first")
    files = [(names.rename(rel), f) for rel, f in template_files()]
    if not files:
        raise NewBackendError("this installation of veomni-ops ships no backend template (veomni_ops/new_backend/"
                              "backend-template is empty): reinstall veomni-ops")
    created = not out.exists()
    written = []
    try:
        for rel, f in files:
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(names.rename(f.read_text(encoding="utf-8")), encoding="utf-8")
            if path.suffix == ".sh":
                path.chmod(0o755)
            written.append(path)
    except BaseException:
        # Nothing half-written is left: a folder this call created goes, an empty one given is emptied.
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise
    return written
