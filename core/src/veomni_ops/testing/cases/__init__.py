"""What the conformance kit feeds each op, as data: input generators and how to call a kernel.

For every op an :class:`OpHarness` says how to call a kernel per its contract
(:mod:`veomni_ops.hookspecs`), which eager function is the reference for each variant, which
dtypes the outputs must have, and lists :class:`Case` objects per variant and size:

* ``small`` — a few dozen elements per tensor; what CI runs on the CPU and under the Triton
  interpreter (``TRITON_INTERPRET=1``);
* ``full`` — shapes of real models (hidden sizes of thousands, vocabularies of tens of
  thousands), for GPUs.

Every case builds fresh random inputs from a seed (:class:`Builder`): odd sizes, the layouts
models actually pass (``[B, S, H, D]`` tensors transposed into ``[B, H, S, D]``, gate and up
as two halves of one projection, rows with a stride), and the op's edge cases: mixed dtypes
(a float32 norm weight with 16-bit activations), experts with no tokens, every token to one
expert, a token listing one expert twice, every label ``ignore_index``, a non-default
``ignore_index``, padding masks, partial rotary, values wide enough that statistics computed
in half precision would overflow.

Tensors are generated in float64 from seeded ``torch.Generator`` objects — on the device
under test for the large random tensors (generating hundreds of millions of float64 values
on the CPU would dominate a GPU run), on the CPU for small integer draws — then cast to the
dtype under test. A seed gives the same inputs on every run on the same kind of device. The
reference sees exactly those values, cast back to float64.

Each op's harness and cases are in its folder, ``veomni_ops/ops/<op>/cases.py`` (``HARNESS``),
beside :mod:`~veomni_ops.testing.cases.base`; :func:`harness` and :data:`HARNESSES` read them from
the op folders. Adding an op adds its ``cases.py``, nothing here. The names the per-op modules
always had stay importable from here (``RMS_NORM``: the ``rms_norm`` harness; ``cos_sin``,
``router_logits``, ``AttentionModule``, ...), and so do their old module paths
(``veomni_ops.testing.cases.cross_entropy``: the same module as ``veomni_ops.ops.cross_entropy.cases``).
"""

from __future__ import annotations

import importlib
import sys
from functools import cache
from typing import Any

from ...ops import OP_DEFS
from .base import SIZES, TORCH_DTYPES, Builder, Case, OpHarness, loss_dtypes, pick, same_dtype

#: Module names the per-op case modules had here before they moved into the op folders, where
#: they differ from the op's name (an op's own name is an alias too).
_OLD_MODULES = {"moe": "moe_experts", "load_balancing": "load_balancing_loss"}


@cache
def _cases_module(op: str) -> Any:
    """The module holding ``op``'s harness and cases (imported now)."""
    d = OP_DEFS[op]
    return importlib.import_module(d.harness.partition(":")[0], d.package)


def harness(op: str) -> OpHarness:
    """The conformance harness of ``op``, from its folder (``OpDef.harness``)."""
    d = OP_DEFS.get(op)
    if d is None:
        raise ValueError(f"the conformance kit has no cases for op {op!r}; ops: {', '.join(OP_DEFS)}")
    h = d.part("harness")
    if not isinstance(h, OpHarness) or h.op != op:
        raise TypeError(f"{d.package}: {d.harness} must be the OpHarness of op {op!r}")
    return h


def __getattr__(name: str) -> Any:
    # HARNESSES and the old per-module names, read from the op folders on first use (an op's
    # cases module imports .base from this package, so nothing here may import it eagerly).
    if name == "HARNESSES":
        return {op: harness(op) for op in OP_DEFS}
    if name == "_router_logits":  # the former private name, still imported by tests outside the core
        name = "router_logits"
    if name.lower() in OP_DEFS and name.isupper():  # RMS_NORM, MOE_EXPERTS, ...: the op's harness
        return harness(name.lower())
    for op in OP_DEFS:
        if not name.startswith("_") and hasattr(module := _cases_module(op), name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _alias_old_modules() -> None:
    """``veomni_ops.testing.cases.<op>`` (and the two older names) is the op folder's cases module."""
    for op in OP_DEFS:
        module = _cases_module(op)
        for old in (op, *(o for o, target in _OLD_MODULES.items() if target == op)):
            sys.modules.setdefault(f"{__name__}.{old}", module)


_alias_old_modules()

__all__ = [
    "SIZES", "TORCH_DTYPES", "Builder", "Case", "OpHarness", "harness", "loss_dtypes", "pick",
    "same_dtype",
]
