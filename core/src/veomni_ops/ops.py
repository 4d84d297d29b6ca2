"""The ops the core knows: one table, read by every part of the runtime.

Each op has its variants (the first is the default), the field a VeOmni ``ops_implementation``
config sets it with, the optional features a kernel may honour for it and the parallel layouts
a kernel may run under. :data:`OPS`, :data:`FEATURES` and :data:`PARALLEL` (re-exported by
:mod:`veomni_ops.spec`) and the config's ``FIELD_TO_OP`` are views of :data:`OP_TABLE`.
Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class OpInfo:
    """One op. ``variants``: the first is the default. ``config_field``: VeOmni's
    ``OpsImplementationConfig`` field for it (also an :class:`~veomni_ops.config.OpsConfig`
    field). ``features``: optional behaviours a kernel may honour beyond the op's contract
    (:data:`FEATURES`). ``parallel``: parallel layouts a kernel may declare it runs under
    (:data:`PARALLEL`)."""

    variants: tuple[str, ...]
    config_field: str
    features: tuple[str, ...] = ()
    parallel: tuple[str, ...] = ()


#: Every op, in the order resolution goes through them (and a plan lists them).
OP_TABLE: Mapping[str, OpInfo] = {
    "rms_norm": OpInfo(("standard", "offset"), "rms_norm_implementation"),
    "rotary": OpInfo(("full", "partial"), "rotary_pos_emb_implementation"),
    "swiglu": OpInfo(("standard",), "swiglu_mlp_implementation"),
    "cross_entropy": OpInfo(("logits", "fused_linear"), "cross_entropy_loss_implementation"),
    "moe_experts": OpInfo(("standard",), "moe_implementation", parallel=("ep",)),
    "load_balancing_loss": OpInfo(("standard",), "load_balancing_loss_implementation"),
    "attention": OpInfo(("standard",), "attn_implementation",
                        features=("softcap", "sinks", "sliding_window", "dropout"), parallel=("sp",)),
}

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
