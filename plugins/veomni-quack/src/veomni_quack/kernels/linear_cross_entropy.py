"""``cross_entropy`` / ``fused_linear`` through ``quack.linear_cross_entropy``.

**Status: not yet run.** In the one measured environment (H100, torch 2.11, quack-kernels
0.6.5, nvidia-cutlass-dsl 4.8.1) ``import quack.linear_cross_entropy`` failed ("epilogue fn
depends on <ContextVar ...> which has no fail-closed semantic key"). This module imports it
at module import, so on such an install resolving ``quack`` for ``fused_linear`` is
refused with that import error chained -- never a silent fallback.

Quack 0.6.5's ``chunked_linear_cross_entropy(x, weight, target, chunk_size=4096,
ignore_index=-100, reduction="mean", tuned=True, use_scaled_exp=None)``:

* walks the tokens in chunks of ``chunk_size``; per chunk the logits are ``x_chunk @ W.T`` in
  the input dtype (base pipeline: ``torch.mm``), the per-row loss is float32 (Quack's
  cross-entropy kernel) and dlogits overwrite the chunk's logits; dX and an float32 dW
  accumulator are filled during the forward; backward scales them by the incoming gradient
  (in place) and casts dW once to the weight dtype;
* on sm 9.0 with bf16, ``V % 128 == 0`` and ``chunk_size % 128 == 0`` it auto-selects the
  "scaled-exp" pipeline (logits never stored; loss from the GEMM's float32 accumulators);
* ``reduction="sum"`` returns ``loss.sum()`` of the float32 per-row losses: the contract;
* has no bias, and asserts ``N % 8 == 0`` and ``chunk_size % 8 == 0`` (TMA alignment); its
  GEMMs need 16-byte rows, so ``H % 8 == 0`` and ``V % 8 == 0`` for 16-bit inputs.

What this adapter adds: N is padded to a multiple of 8 with zero rows labelled
``ignore_index`` (they add 0 to the loss and 0 to dW; their dX rows are cut off), a bias or
an H/V that is not a multiple of 8 is refused with a clear error, labels are range-checked
(one host sync), ``tuned=False`` (Quack's ``tuned=True`` autotunes the dW GEMM at the first
call of each shape, minutes of CuTe compiles), and a second backward through the same loss
raises: Quack scales its stored gradients in place, so a second pass would return them
scaled twice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import CHECKS, import_quack, quack_labels, to_layout

_lce = import_quack("quack.linear_cross_entropy")
_quack_chunked_lce = _lce.chunked_linear_cross_entropy

_OP = "cross_entropy"

#: Tokens per chunk: Quack's default, a multiple of 128 (needed by the scaled-exp pipeline).
CHUNK_SIZE = 4096
#: Rows of hidden and the token count must be multiples of this (Quack's TMA alignment).
ALIGN = 8
DTYPES = (torch.bfloat16, torch.float16)


class _BackwardOnce(torch.autograd.Function):
    """Identity on the loss whose backward refuses to run twice (module docstring)."""

    @staticmethod
    def forward(ctx, loss):  # type: ignore[override]
        ctx.done = False
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if ctx.done:
            raise RuntimeError(
                "cross_entropy (quack fused_linear): backward ran twice through the same loss; Quack scales "
                "its stored gradients in place, so a second pass would be wrong. Recompute the loss instead "
                "of backward(retain_graph=True)"
            )
        ctx.done = True
        return grad


def _check(hidden, weight, labels, bias, ignore_index) -> torch.Tensor:
    CHECKS.check_linear_cross_entropy_inputs(hidden, weight, labels, bias, ignore_index)
    if hidden.dtype not in DTYPES:
        raise TypeError(
            f"{_OP} (quack fused_linear): dtype {hidden.dtype} is not supported here (bfloat16 and float16 only); "
            "use 'chunked' or 'liger' for float32"
        )
    if bias is not None:
        raise ValueError(
            f"{_OP} (quack fused_linear): Quack's linear cross-entropy has no bias; this lm_head has one. "
            "Use the 'chunked' or 'liger' kernel for a biased lm_head"
        )
    labels = quack_labels(labels, ignore_index, _OP)
    h, vocab = hidden.shape[1], weight.shape[0]
    if h % ALIGN or vocab % ALIGN:
        raise ValueError(
            f"{_OP} (quack fused_linear): hidden size {h} and vocabulary {vocab} must be multiples of {ALIGN} "
            "(Quack's GEMMs need 16-byte rows); pad the lm_head or use the 'chunked' kernel"
        )
    return labels


def fused_linear_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """``sum_i CE(hidden_i @ weight.T, labels_i)`` over counted tokens, float32, never all logits at once."""
    labels = _check(hidden, weight, labels, bias, ignore_index)
    n = hidden.shape[0]
    if n == 0:
        # No tokens: an empty sum, connected to the graph so backward yields zeros.
        return (hidden.sum() * 0 + weight.sum() * 0).float()
    pad = -n % ALIGN
    x = hidden
    if pad:
        # Zero rows labelled ignore_index: loss 0, dlogits 0 (so dW unchanged); F.pad's
        # backward drops their dX rows.
        x = F.pad(x, (0, 0, 0, pad))
        labels = F.pad(labels, (0, pad), value=ignore_index)
    x = to_layout(x, ALIGN)
    w = to_layout(weight, ALIGN)
    loss = _quack_chunked_lce(
        x, w, labels, chunk_size=CHUNK_SIZE, ignore_index=ignore_index, reduction="sum", tuned=False
    )
    if loss.requires_grad:
        loss = _BackwardOnce.apply(loss)
    return loss
