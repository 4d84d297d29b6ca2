"""``veomni-ops new-backend NAME [DIR] [--distribution DIST]``: a new third-party backend, written
as a renamed copy of the backend template.

The template (``backend-template/`` beside this module, package data of the core's wheel; the same
files are ``examples/backend-template`` in a checkout) is a complete backend: one SwiGLU
kernel in plain PyTorch, its spec module, its tests, a ``ci.sh`` that builds, installs, tests
and checks it. A copy for ``NAME`` renames everything the template calls ``template``:

* the kernel name and the entry point: ``NAME`` (``swiglu_mlp_implementation: NAME``);
* the distribution: ``DIST`` (default ``veomni-backend-NAME``), and the package, ``DIST``
  with ``_`` for ``-`` (``veomni_backend_NAME``: ``src/`` and every import);
* the tests' names (``tests/test_NAME.py``, ``TestNAMESwiglu``) and every other mention.

Every name is checked before anything is written, and ``DIR`` (default ``./DIST``) must not
exist yet or be empty. No torch at import.
"""

from __future__ import annotations

from .command import configure, run
from .writer import Names, NewBackendError, names_for, template_files, write_backend

__all__ = ["NewBackendError", "Names", "configure", "names_for", "run", "template_files", "write_backend"]
