"""``attention``'s reference kernels live in the op's folder, :mod:`veomni_ops.ops.attention.kernel`;
this module keeps the import path plugins use (``from veomni_ops.kernels.attention import ...``).

Resolved on first use (:mod:`._reexport`), so that importing this module imports no kernel.
"""

from __future__ import annotations

from typing import Any

from ._reexport import names, resolve

_KERNEL = "veomni_ops.ops.attention.kernel"


def __getattr__(name: str) -> Any:
    return resolve(__name__, _KERNEL, name)


def __dir__() -> list[str]:
    return names(__name__, _KERNEL)
