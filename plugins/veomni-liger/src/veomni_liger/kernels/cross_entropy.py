"""``cross_entropy`` contract (sum over counted tokens) -> Liger's cross-entropy kernels.

Both adapters call Liger's forward functions -- the ones its autograd Functions
(``LigerCrossEntropyFunction``, ``LigerFusedLinearCrossEntropyFunction``) run -- inside
small autograd Functions of their own. Liger computes every gradient *during the forward*
(that is its whole trick) and stores it for backward; backward only scales it by the
incoming gradient. The adapters keep that and fix what does not fit the contract:

``logits`` (``cross_entropy_forward``):

* Liger's ``reduction="sum"`` adds the per-token losses in the logits' dtype: a float16
  sum of 8192 tokens overflows to ``inf``. The adapter asks for ``reduction="none"``
  (the kernel's gradient is then identical to ``"sum"``: no division) and adds the
  per-token losses in float32 itself. The per-token losses are still rounded to the
  logits' dtype by Liger; the spec's bf16/fp16 tolerances allow for it.
* Liger writes d(loss)/d(logits) **into the logits buffer**. Its Function decides whether
  to do so from ``logits.requires_grad`` *after* ``.contiguous()``, which under the
  no-grad forward of an autograd Function returns a tensor that does not require grad: a
  column-strided ``logits`` then gets no gradient computed and backward returns the raw
  logits as their gradient (checked on 0.8.5). The adapter sets ``requires_grad`` itself.
* The overwrite of the caller's logits is kept (it is the memory saving) but made visible
  to autograd: their version counter is bumped, so anything else that saved the logits for
  backward raises instead of silently using gradients, and a second backward through the
  same graph raises too. Callers must not read ``logits`` after the loss when they require
  grad. Without grad (evaluation) nothing is written.

``fused_linear`` (``fused_linear_cross_entropy_forward``):

* ``reduction="sum"`` (the loss buffer is float32 there), ``accum_dtype=float32`` for the
  weight/bias gradient accumulators when the weight is bf16/fp16 -- Liger's default
  accumulates chunk after chunk in the parameter's dtype. Costs one float32 [V, H] buffer
  (plus the final cast) during the forward.
* Chunk size: Liger's default sizes a chunk so its logits are no larger than the hidden
  states (``chunk_mem_const=1``): 256 tokens at hidden 2560 / vocabulary 151936. Every
  chunk then adds its weight gradient into the float32 ``[V, H]`` accumulator -- a 1.56 GB
  read and write each time, 32 times for 8192 tokens, which dominated the adapter's time
  (74 ms fwd+bwd on an H100 against eager's 45 ms). The adapter passes the largest
  ``chunk_mem_const`` whose chunk logits stay within :data:`CHUNK_LOGITS_BUDGET_BYTES`
  (2048 tokens there: 4 accumulations), trading a bounded amount of memory for time.
* Liger computes the weight gradient only when *hidden* requires grad, and computes
  gradients whenever tensors require grad, even under ``torch.no_grad()``. The adapter
  passes detached tensors whose ``requires_grad`` says what is actually needed.
* Backward scales the stored gradients in place with ``mul_`` (Liger uses a Triton kernel
  that autograd cannot see), so a second backward through the graph raises.

Both: labels out of ``[0, V)`` (other than ``ignore_index``) raise a clear error -- Liger
would read out of bounds (its fused-linear kernel has no check, its plain one an
``assert``). With every label ignored the result is 0 and every gradient is zero (Liger
skips ignored rows and the adapter never divides). Zero tokens return a differentiable 0.
"""

from __future__ import annotations

import torch
from liger_kernel.ops.cross_entropy import cross_entropy_forward
from liger_kernel.ops.fused_linear_cross_entropy import fused_linear_cross_entropy_forward
from torch.autograd.graph import increment_version

from ..memory import CHUNK_LOGITS_BUDGET_BYTES, chunk_mem_const
from ._common import CHECKS

_OP = "cross_entropy"


def _zero_loss(*tensors: torch.Tensor | None) -> torch.Tensor:
    # A float32 0 that is differentiable w.r.t. every tensor (zero gradients).
    parts = [t.reshape(-1)[:0].sum(dtype=torch.float32) for t in tensors if t is not None]
    return torch.stack(parts).sum()


class _LigerCrossEntropySum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, need_grad: bool) -> torch.Tensor:
        # The kernel indexes columns with stride 1 (rows may be strided); anything else is copied.
        x = logits if logits.stride(-1) == 1 else logits.contiguous()
        # Liger computes (and stores into x) the gradient iff x.requires_grad. detach() shares
        # storage and version counter with the caller's logits.
        x = x.detach().requires_grad_(need_grad)
        out = cross_entropy_forward(x, labels, None, ignore_index, 0.0, 0.0, "none", None, False)
        loss = out[0].sum(dtype=torch.float32)
        if need_grad:
            grad = out[-1]
            increment_version(grad)
            ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        (grad,) = ctx.saved_tensors
        # In place: the buffer is the one Liger stored the gradient in; mul_ bumps its version.
        grad.mul_(grad_loss)
        return grad, None, None, None


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor, *, ignore_index: int = -100) -> torch.Tensor:
    """``sum_i CE(logits_i, labels_i)`` over ``labels_i != ignore_index``, float32, via Liger.

    ``logits [N, V]`` (float32/bfloat16/float16), ``labels [N]`` (integer). When ``logits``
    requires grad, Liger overwrites it with its gradient during this call (module doc).
    """
    CHECKS.check_float(logits, "logits", _OP)
    CHECKS.check_ndim(logits, 2, "logits", _OP, "[N, V] (flatten leading dimensions with .view(-1, V))")
    CHECKS.check_same_device(_OP, logits=logits, labels=labels)
    n, vocab = logits.shape
    CHECKS.check_labels(labels, n, ignore_index)
    CHECKS.check_label_values(labels, vocab, ignore_index)
    if n == 0:
        return _zero_loss(logits)
    need_grad = torch.is_grad_enabled() and logits.requires_grad
    return _LigerCrossEntropySum.apply(logits, labels.long().contiguous(), ignore_index, need_grad)


class _LigerFusedLinearCrossEntropySum(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        ignore_index: int,
        need_hidden: bool,
        need_weight: bool,
        need_bias: bool,
    ) -> torch.Tensor:
        # Liger computes all gradients iff _input.requires_grad, the weight's iff also
        # weight.requires_grad, the bias's whenever a bias is given.
        any_grad = need_hidden or need_weight or need_bias
        # Contiguous rows: Liger's GPU path writes dhidden chunks with torch.mm(out=...).
        h = hidden.detach().contiguous().requires_grad_(any_grad)
        w = weight.detach().requires_grad_(need_weight)
        b = bias.detach() if bias is not None else None
        accum = torch.float32 if weight.dtype in (torch.bfloat16, torch.float16) else None
        out = fused_linear_cross_entropy_forward(
            _input=h,
            weight=w,
            target=labels,
            bias=b,
            ignore_index=ignore_index,
            reduction="sum",
            accum_dtype=accum,
            chunk_mem_const=chunk_mem_const(
                h.shape[0], h.shape[1], w.shape[0], h.element_size(), CHUNK_LOGITS_BUDGET_BYTES
            ),
        )
        loss = out[0]
        grad_hidden, grad_weight, grad_bias = out[-3:]
        ctx.save_for_backward(
            grad_hidden if need_hidden else None,
            grad_weight if need_weight else None,
            grad_bias if need_bias else None,
        )
        return loss.to(torch.float32)

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grads = []
        for g in ctx.saved_tensors:
            if g is not None:
                g.mul_(grad_loss)  # in place: Liger's buffer; mul_ bumps its version
            grads.append(g)
        grad_hidden, grad_weight, grad_bias = grads
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def fused_linear_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """``sum_i CE(hidden_i @ weight.T (+ bias), labels_i)`` without materialising all logits, via Liger.

    ``hidden [N, H]``, ``weight [V, H]``, ``labels [N]``, ``bias [V]`` or None; one float dtype
    for hidden/weight/bias. Returns a float32 scalar.
    """
    CHECKS.check_linear_cross_entropy_inputs(hidden, weight, labels, bias, ignore_index)
    n = hidden.shape[0]
    if n == 0:
        return _zero_loss(hidden, weight, bias)
    grad_on = torch.is_grad_enabled()
    need_hidden = grad_on and hidden.requires_grad
    need_weight = grad_on and weight.requires_grad
    need_bias = grad_on and bias is not None and bias.requires_grad
    return _LigerFusedLinearCrossEntropySum.apply(
        hidden, weight, bias, labels.long().contiguous(), ignore_index, need_hidden, need_weight, need_bias
    )
