"""How ``veomni_ops.kernels.<module>`` keeps an old import path without importing an op's kernel.

Each of those modules names its op's ``kernel`` module by string and resolves a name from it
on first use (a module ``__getattr__``, PEP 562): ``from veomni_ops.kernels.moe import routed``
imports :mod:`veomni_ops.ops.moe_experts.kernel` then, and only then, so that no module below
``ops/`` imports an op's heavy module (the layering rule of ``tools/import_graph.py``).
The names are the kernel module's ``__all__``, the same objects; a resolved name is kept in
the re-exporting module, as the star import that was here before kept it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def resolve(module: str, kernel: str, name: str) -> Any:
    """``name`` of the module ``kernel`` (one of its ``__all__``, or ``__all__`` itself) for the
    re-exporting module ``module``; ``AttributeError`` for any other name, as a module raises."""
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    source = importlib.import_module(kernel)
    if name != "__all__" and name not in source.__all__:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    value = getattr(source, name)
    setattr(sys.modules[module], name, value)
    return value


def names(module: str, kernel: str) -> list[str]:
    """What ``dir()`` of the re-exporting module ``module`` lists: its own names and the kernel
    module's ``__all__``."""
    return sorted({*vars(sys.modules[module]), *importlib.import_module(kernel).__all__})


def lazy(module: str, kernel: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the re-exporting module ``module`` for the kernel
    module ``kernel``: ``__getattr__, __dir__ = lazy(__name__, "veomni_ops.ops.<op>.kernel")``."""
    return (lambda name: resolve(module, kernel, name)), (lambda: names(module, kernel))
