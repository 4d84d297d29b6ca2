"""The core's reference backend: light spec module (entry point ``eager``).

Registers, through the ordinary hooks (one per op, named after it), the plain-PyTorch kernels
each op's folder declares (``veomni_ops/ops/<op>/reference.py``):

* ``eager`` for every op and variant (priority 0): transformers' own computation, the
  reference every other kernel is checked against;
* ``sdpa`` (attention), ``chunked`` (fused linear cross-entropy) and ``grouped_mm`` (MoE
  experts), portable fast kernels at priority 10;
* ``flex_attention`` (PyTorch's FlexAttention, CUDA), at priority -1: only when named.

Like every spec module this one imports no torch: factories are ``"module:attr"``
strings resolved only when a config selects the kernel. What the specs share (dtypes,
tolerance presets, the ``eager`` spec maker) is :mod:`veomni_ops.backends.base`.
"""

from __future__ import annotations

from collections.abc import Callable

from veomni_ops.backends.base import (
    ALL_DTYPES,
    ANYWHERE,
    EAGER_PRIORITY,
    ELEMENTWISE_TOLERANCES,
    LOSS_TOLERANCES,
    MATMUL_TOLERANCES,
    NORM_TOLERANCES,
    PORTABLE_PRIORITY,
)
from veomni_ops.hookspecs import hookimpl
from veomni_ops.ops import OP_DEFS
from veomni_ops.spec import KernelSpec

__all__ = ["ALL_DTYPES", "ANYWHERE", "EAGER_PRIORITY", "PORTABLE_PRIORITY", *OP_DEFS]

# The presets' former names, still imported by tests outside the core.
_ELEMENTWISE, _NORM, _MATMUL, _LOSS = ELEMENTWISE_TOLERANCES, NORM_TOLERANCES, MATMUL_TOLERANCES, LOSS_TOLERANCES


def _hook(op: str) -> Callable[[], list[KernelSpec]]:
    """The hook implementation of ``op``: its folder's reference specs."""

    def specs() -> list[KernelSpec]:
        return list(OP_DEFS[op].part("reference")())

    specs.__name__ = specs.__qualname__ = op
    specs.__doc__ = f"The core's own {op} kernels (veomni_ops/ops/{op}/reference.py)."
    return hookimpl(specs)


# One hook implementation per op, named after it (as pluggy finds them): ``reference.swiglu()``.
globals().update({op: _hook(op) for op in OP_DEFS})
