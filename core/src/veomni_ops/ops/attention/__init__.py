"""The ``attention`` op (see :mod:`veomni_ops.ops`): attention, with the signature of transformers' AttentionInterface."""

from __future__ import annotations

from ..base import OpDef, OpInfo

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

OP = OpDef(
    "attention", order=70, contract=CONTRACT, package=__name__, wrapper=".parallel:wrap",
    info=OpInfo(("standard",), "attn_implementation", features=("softcap", "sinks", "sliding_window", "dropout"),
                parallel=("sp",)),
    legacy={**_WITH_SP, "veomni_flex_attention_with_sp": "flex_attention"},
    legacy_notes={
        **{value: (f"it meant {kernel}, sequence-parallel when sp > 1: write {kernel} and set the job's parallel.sp "
                   "(Ulysses sequence parallelism now wraps any attention kernel; with sp 1 it runs as it is)")
           for value, kernel in _WITH_SP.items()},
        "veomni_flex_attention_with_sp": (
            "it meant flex_attention, sequence-parallel when sp > 1; veomni-ops' flex_attention does not run under "
            "sequence parallelism (a job with parallel.sp > 1 refuses it: take sdpa or a flash kernel there)"),
    },
)
