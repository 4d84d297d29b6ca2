"""The ops the core knows: one folder per op, and the tables every part of the runtime reads.

Each op lives in ``veomni_ops/ops/<op>/``, whose ``__init__`` defines ``OP =``
:class:`~veomni_ops.ops.base.OpDef` (light: no torch): the op's variants (the first is the
default), the field a VeOmni ``ops_implementation`` config sets it with, the optional features
a kernel may honour and the parallel layouts a kernel may run under (:class:`OpInfo`), its
kernel contract (the hookspec), its legacy values and measured compile-mode choices. Beside it
in the folder, imported only when used: ``reference`` (the core's ``eager`` specs), ``kernel``
(the reference kernels and their input checks), ``binder`` (where the op lives in a model),
``cases`` (the conformance cases), ``bench`` (the bench workloads) and, where the op has one,
``parallel`` (how a parallel layout wraps its kernel).

Every folder of this package with an ``OP`` is an op: :data:`OP_DEFS` is read from the folders,
and :data:`OP_TABLE`, :data:`OPS`, :data:`FEATURES` and :data:`PARALLEL` (re-exported by
:mod:`veomni_ops.spec`) are views of it, as are the hookspecs (:mod:`veomni_ops.hookspecs`), the
config's fields and legacy values (:mod:`veomni_ops.config`), the reference backend, the
binders, the conformance harnesses and base classes, the pytest plugin's ops, the bench's
formulas and presets and the compile policy. Nothing here imports torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping

from .base import OpDef, OpInfo, conformance_class_name

__all__ = ["FEATURES", "OPS", "OP_DEFS", "OP_TABLE", "PARALLEL", "OpDef", "OpInfo", "conformance_class_name",
           "op_def"]


def _read_folders() -> dict[str, OpDef]:
    """Every op folder's ``OP``, in ``order``. A folder without a valid ``OP`` is a mistake in
    this package: refused at import, saying which folder and what to write."""
    found: list[OpDef] = []
    for m in pkgutil.iter_modules(__path__):
        if not m.ispkg:
            continue
        module = importlib.import_module(f"{__name__}.{m.name}")
        d = getattr(module, "OP", None)
        if not isinstance(d, OpDef):
            raise RuntimeError(f"{module.__name__}: an op folder defines OP = veomni_ops.ops.base.OpDef(...) in its "
                               f"__init__.py (got {type(d).__name__})")
        if d.name != m.name or d.package != module.__name__:
            raise RuntimeError(f"{module.__name__}: OP.name ({d.name!r}) and OP.package ({d.package!r}) must be the "
                               f"folder's name ({m.name!r}) and module (__name__)")
        found.append(d)
    orders: dict[int, str] = {}
    for d in found:
        if d.order in orders:
            raise RuntimeError(f"ops {orders[d.order]!r} and {d.name!r} both have order {d.order}: give each op its "
                               "own place")
        orders[d.order] = d.name
    return {d.name: d for d in sorted(found, key=lambda d: d.order)}


#: Every op's definition, read from its folder, in the order resolution goes through them.
OP_DEFS: Mapping[str, OpDef] = _read_folders()

#: Every op, in the order resolution goes through them (and a plan lists them).
OP_TABLE: Mapping[str, OpInfo] = {op: d.info for op, d in OP_DEFS.items()}

#: Every op the core knows, with its variants. The first variant is the default one.
OPS: Mapping[str, tuple[str, ...]] = {op: info.variants for op, info in OP_TABLE.items()}

#: Optional behaviours a kernel may honour beyond its op's contract, per op. A model place
#: that needs one (Gemma-2's attention soft-capping, GPT-OSS's attention sinks) only takes a
#: kernel whose spec lists it in ``features``.
FEATURES: Mapping[str, tuple[str, ...]] = {op: info.features for op, info in OP_TABLE.items() if info.features}

#: Parallel layouts a kernel may declare it runs under, per op (``KernelSpec.parallel``). ``sp``:
#: the attention kernel is called by the Ulysses wrapper on the whole sequence and a slice of
#: the heads (it reads heads from the tensors, not from the module, and takes no mask: the
#: causality, window and packing come from the call). ``ep``: the experts kernel is called on
#: a slice of the experts (E from ``gate_up_proj``) with routes to other ranks' experts as ``-1``.
PARALLEL: Mapping[str, tuple[str, ...]] = {op: info.parallel for op, info in OP_TABLE.items() if info.parallel}


def op_def(op: str) -> OpDef:
    """The definition of ``op``; ``ValueError`` naming the ops for an unknown one."""
    try:
        return OP_DEFS[op]
    except KeyError:
        raise ValueError(f"unknown op {op!r}; the ops: {', '.join(OP_DEFS)}") from None
