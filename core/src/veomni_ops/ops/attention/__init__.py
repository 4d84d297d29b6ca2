"""The ``attention`` op (see :mod:`veomni_ops.ops`): attention, with the signature of transformers' AttentionInterface."""

from __future__ import annotations

from ..base import VEOMNI_SOURCE, DeviceChoice, NotProvided, OpDef, OpInfo

#: The kernel contract: the docstring of the ``attention`` hook (:class:`veomni_ops.hookspecs.OpHookspecs`).
CONTRACT = """Attention with the signature of transformers' ``AttentionInterface``.

Kernel signature::

    kernel(module: nn.Module, query: Tensor[B, Hq, S, D], key: Tensor[B, Hk, Sk, D],
           value: Tensor[B, Hk, Sk, D], attention_mask: Tensor | None, *,
           dropout: float = 0.0, scaling: float | None = None,
           sliding_window: int | None = None, softcap: float | None = None,
           **kwargs) -> tuple[Tensor[B, S, Hq, D], Tensor | None]

Hq is a multiple of Hk (GQA). ``attention_mask`` is the mask transformers builds
for this implementation (for ``eager``/``sdpa`` the 4-D boolean or additive
``[B, 1, S, Sk]``; the 2-D padding mask for flash kernels), or None; causality comes
from ``module.is_causal`` / ``kwargs["is_causal"]``. A kernel that cannot honour an
argument it is given (e.g. dropout) raises ``ValueError`` naming it.

Packed sequences (documents side by side in one row) arrive as any of: a 4-D mask
that transformers made block-diagonal from packed ``position_ids`` (authoritative
where given); ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (cumulative document lengths of
a packed batch, with optional ``max_length_q`` / ``max_length_k`` launch bounds, which
mean nothing without them); ``position_ids`` of a batch of one row (``[S]`` or
``[1, S]``) that restart (a position that does not continue the previous one by +1
starts a document). Position ids of other shapes (``[3, B, S]`` multimodal
positions, a sequence-parallel shard) are not packing information; packed batches of
those come as the mask or ``cu_seq_lens``. Every kernel either honours each of these
-- attention never crosses a document boundary, causal within each document -- or
refuses it with a ``ValueError`` naming the argument and which kernels honour it;
none is ignored. The core's ``eager`` and ``sdpa`` honour all of them by building the
block-diagonal mask (``veomni_ops.kernels.attention.packing_mask``; they also honour
restarts in every row of ``[B, S]`` position ids, as transformers' masks do, and take
``cu_seq_lens`` only for a ``[1, total]`` batch); veomni-flash's kernels honour them
with varlen launches.

Returns the output in ``[B, S, Hq, D]`` and optionally the attention weights.
Backward produces gradients for query, key and value. Variant: ``standard``.
"""

#: VeOmni's sequence-parallel attention values: today's kernel, and what the value meant besides.
_WITH_SP = {f"veomni_flash_attention_{v}_with_sp": f"flash_attention_{v}" for v in (2, 3, 4)}

#: VeOmni's MagiAttention values: veomni-ops has no kernel for them.
_MAGI = NotProvided(
    "MagiAttention's FFA kernels (veomni/ops/kernels/attention/magi/, registered at "
    "veomni/ops/kernels/attention/__init__.py:89)",
    "the magi-attention 1.1.1 package, an NVIDIA GPU of sm 9.0 or newer, a MagiAttentionMask built by the model, "
    "batch size 1, context-parallel size 1 and no attention dropout (veomni/ops/kernels/attention/magi/"
    "__init__.py:95-112)",
    "attn_implementation: flash_attention_3 (Hopper) or flash_attention_4 (sm 9.0+), flex_attention for a custom "
    "mask on CUDA, or auto",
)

OP = OpDef(
    "attention", order=70, contract=CONTRACT, package=__name__, wrapper=".parallel:wrap",
    info=OpInfo(("standard",), "attn_implementation", features=("softcap", "sinks", "sliding_window", "dropout"),
                parallel=("sp",)),
    legacy={**_WITH_SP, "veomni_flex_attention_with_sp": "flex_attention"},
    # On an Ascend NPU VeOmni's flash attention (veomni/ops/kernels/attention/flash.py:21,278) is
    # transformers' _flash_attention_forward, which there takes the NPU functions for every flash
    # implementation (transformers/modeling_flash_attention_utils.py, _lazy_imports): veomni-npu's 'npu'.
    veomni_values={
        f"flash_attention_{v}": DeviceChoice(
            "npu", f"flash_attention_{v}",
            "VeOmni's flash attention, which on an Ascend NPU runs transformers' NPU flash attention "
            "(transformers.integrations.npu_flash_attention: torch_npu.npu_fusion_attention; VeOmni d977449, "
            "veomni/ops/kernels/attention/flash.py:21,278)",
            legacy=False,
        )
        for v in (2, 3, 4)
    },
    veomni_not_provided={
        "magi_attention": _MAGI,
        "veomni_magi_attention_with_sp": _MAGI,
        "native_sparse": NotProvided(
            f"a value its config type lists ({VEOMNI_SOURCE}:1034) but no kernel behind it: VeOmni registers none under "
            "that name, and hands it to transformers as attn_implementation, which has no 'native-sparse' either",
            "a kernel nobody ships",
            "attn_implementation: sdpa, a flash kernel, or auto",
        ),
    },
    legacy_notes={
        **{value: (f"it meant {kernel}, sequence-parallel when sp > 1: write {kernel} and set the job's parallel.sp "
                   "(Ulysses sequence parallelism now wraps any attention kernel; with sp 1 it runs as it is)")
           for value, kernel in _WITH_SP.items()},
        "veomni_flex_attention_with_sp": (
            "it meant flex_attention, sequence-parallel when sp > 1; veomni-ops' flex_attention does not run under "
            "sequence parallelism (a job with parallel.sp > 1 refuses it: take sdpa or a flash kernel there)"),
    },
)
