"""Token cross-entropy as a **sum** over counted tokens: plain, fused-linear, chunked.

* :func:`cross_entropy_sum` — the ``logits`` variant (eager reference).
* :func:`fused_linear_cross_entropy_sum` — the ``fused_linear`` eager reference: it
  materialises ``logits = hidden @ weight.T (+ bias)`` for all N tokens, exactly what a
  model's ``lm_head`` followed by transformers' ``ForCausalLMLoss`` computes.
* :func:`chunked_fused_linear_cross_entropy_sum` — the portable memory-saving kernel
  (``chunked``): a custom autograd Function that walks the tokens in chunks, computes each
  chunk's logits in the input dtype and its log-softmax in float32, and produces the
  gradients for ``hidden``, ``weight`` and ``bias`` during the forward, so the ``[N, V]``
  logits never exist at once. Backward only scales the stored gradients.

Labels outside ``[0, V)`` other than ``ignore_index`` raise ``ValueError`` naming the op and
the offending label (:func:`check_label_values`) where the values can be read without a
host synchronisation -- CPU tensors, or any device with ``VEOMNI_OPS_CHECK_VALUES=1`` -- at
one reduction; on an accelerator without that switch these kernels add no check (it would
synchronise the loss with the host every step) and an out-of-range label stops the device at
PyTorch's own device-side assertion (``nll_loss`` / ``gather``), never a silent wrong loss.

The losses are float32 (float64 for float64 inputs, so the reference can be gradchecked).
The causal-LM shift and the division by the number of counted tokens (or by
``num_items_in_batch``) belong to the core's loss wrapper; returning the sum is what makes
that division exact.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...kernels.tensor_checks import check_float, check_ndim, check_same_device
from .checks import check_chunk_size, check_label_values, check_labels, check_linear_cross_entropy_inputs
from .memory import CHUNK_LOGITS_BUDGET_BYTES, MIN_CHUNK_TOKENS, MIN_CHUNKS, default_chunk_size

#: Its kernels, and the input checks they use (its folder's :mod:`.checks`): what
#: ``veomni_ops.kernels.<module>`` re-exports.
__all__ = ["CHUNK_LOGITS_BUDGET_BYTES", "MIN_CHUNKS", "MIN_CHUNK_TOKENS", "WEIGHT_GRAD_SLICE_BYTES",
    "add_weight_grad_", "check_chunk_size", "check_float", "check_label_values", "check_labels",
    "check_linear_cross_entropy_inputs", "check_ndim", "check_same_device",
    "chunked_fused_linear_cross_entropy_sum", "cross_entropy_sum", "default_chunk_size",
    "fused_linear_cross_entropy_sum"]

_OP = "cross_entropy"

#: The weight-gradient product of a chunk is formed in vocabulary slices of at most this
#: many bytes before it is added to the float32 accumulator, so no second [V, H] buffer exists.
WEIGHT_GRAD_SLICE_BYTES = 256 * 2**20


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Log-softmax runs in float32 at least; float64 stays float64 so the reference is exact.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    return F.cross_entropy(
        logits.to(_compute_dtype(logits.dtype)), labels.long(), ignore_index=ignore_index, reduction="sum"
    )


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor, *, ignore_index: int = -100) -> torch.Tensor:
    """``sum_i CE(logits_i, labels_i)`` over ``labels_i != ignore_index``; logits upcast to float32.

    ``logits [N, V]``, ``labels [N]`` (integer). All labels ignored gives 0 and zero gradients.
    """
    check_float(logits, "logits", _OP)
    check_ndim(logits, 2, "logits", _OP, "[N, V] (flatten leading dimensions with .view(-1, V))")
    check_labels(labels, logits.shape[0], ignore_index)
    check_same_device(_OP, logits=logits, labels=labels)
    check_label_values(labels, logits.shape[1], ignore_index)
    return _cross_entropy_sum(logits, labels, ignore_index)


def fused_linear_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Eager reference of the ``fused_linear`` variant: full logits, then :func:`cross_entropy_sum`."""
    check_linear_cross_entropy_inputs(hidden, weight, labels, bias, ignore_index)
    logits = F.linear(hidden, weight, bias)
    return _cross_entropy_sum(logits, labels, ignore_index)


def _chunk_step(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    y: torch.Tensor,
    ignore_index: int,
    want_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """One chunk: its loss sum, and, if asked, ``softmax(z) - onehot(y)`` in the input dtype.

    Rows of ignored tokens are *not* zeroed in the gradient (that would be one more pass over
    ``[c, V]``): the caller masks the ``[c, H]`` sides of the two gradient GEMMs instead. The
    third value is the float mask of counted tokens.
    """
    compute = _compute_dtype(h.dtype)
    z = F.linear(h, weight, bias)  # logits in the input dtype
    logp = torch.log_softmax(z, dim=-1, dtype=compute)  # one kernel: upcast and log-softmax
    valid = y != ignore_index
    target = torch.where(valid, y, torch.zeros_like(y)).unsqueeze(1)
    logp_t = logp.gather(1, target).squeeze(1)
    loss = torch.where(valid, -logp_t, torch.zeros_like(logp_t)).sum()
    keep = valid.to(h.dtype).unsqueeze(1)
    if not want_grad:
        return loss, None, keep
    # softmax, rounded to the input dtype once, into z's buffer; then the target column, formed in
    # the compute dtype (p_t - 1) and rounded once, exactly as eager autograd rounds it
    g = torch.exp(logp, out=z)
    del logp
    g.scatter_(1, target, (logp_t.exp() - 1).to(g.dtype).unsqueeze(1))
    return loss, g, keep


def add_weight_grad_(acc: torch.Tensor, g: torch.Tensor, h: torch.Tensor) -> None:
    """``acc += g.T @ h`` for a float32 (or float64) ``acc`` and ``g, h`` in the input dtype.

    On CUDA, one cuBLAS call with ``out_dtype`` (bf16/fp16 operands, float32 accumulation and
    output, ``acc`` read and written in place); elsewhere the product is formed in vocabulary
    slices of at most :data:`WEIGHT_GRAD_SLICE_BYTES` and added, so no second ``[V, H]`` buffer
    exists. Shared with veomni-triton's fused linear cross-entropy.
    """
    if g.dtype == acc.dtype:
        acc.addmm_(g.t(), h)
    elif acc.is_cuda:
        torch.addmm(acc, g.t(), h, out_dtype=acc.dtype, out=acc)
    else:
        v_slice = max(1, WEIGHT_GRAD_SLICE_BYTES // max(1, h.shape[1] * h.element_size()))
        for v0 in range(0, acc.shape[0], v_slice):
            acc[v0 : v0 + v_slice].add_(g[:, v0 : v0 + v_slice].t() @ h)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, ignore_index, chunk_size):  # type: ignore[override]
        n = hidden.shape[0]
        compute = _compute_dtype(hidden.dtype)
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        grad_hidden = torch.empty_like(hidden) if need_h else None
        # Weight gradient accumulates over chunks in float32: summing bf16 partials would lose bits.
        grad_weight = torch.zeros(weight.shape, dtype=compute, device=weight.device) if need_w else None
        grad_bias = torch.zeros(weight.shape[0], dtype=compute, device=weight.device) if need_b else None
        loss = torch.zeros((), dtype=compute, device=hidden.device)
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            h = hidden[start:end]
            chunk_loss, g, keep = _chunk_step(h, weight, bias, labels[start:end], ignore_index, True)
            loss = loss + chunk_loss
            # ignored tokens: their rows of g are not zero, so mask the [c, H] / [c] sides
            if need_h:
                torch.mm(g, weight, out=grad_hidden[start:end]).mul_(keep)
            if need_w:
                add_weight_grad_(grad_weight, g, h * keep)
            if need_b:
                grad_bias.add_((keep.t() @ g).squeeze(0).to(compute))
            del g
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return loss

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        weight_dtype, bias_dtype = ctx.dtypes
        gh = gw = gb = None
        if grad_hidden is not None:
            gh = grad_hidden * grad_output.to(grad_hidden.dtype)
        # Scale and cast in one pass (out= in the parameter dtype): no float32 [V, H] temporary.
        if grad_weight is not None:
            gw = torch.mul(grad_weight, grad_output, out=torch.empty_like(grad_weight, dtype=weight_dtype))
        if grad_bias is not None:
            gb = torch.mul(grad_bias, grad_output, out=torch.empty_like(grad_bias, dtype=bias_dtype))
        return gh, gw, gb, None, None, None


def chunked_fused_linear_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Fused linear cross-entropy sum that never holds the ``[N, V]`` logits.

    Same result as :func:`fused_linear_cross_entropy_sum`. ``chunk_size`` (tokens per
    chunk) defaults to :func:`default_chunk_size`. Peak extra memory: one chunk's logits
    (input dtype + float32), the float32 weight-gradient accumulator ``[V, H]`` (off CUDA plus
    one vocabulary slice of its update, :data:`WEIGHT_GRAD_SLICE_BYTES`), and the hidden
    gradient ``[N, H]``. For N = 8192, H = 2560, V = 151,936 in bfloat16, measured on an H100:
    1.9 GiB beyond the inputs and gradients against eager's 13.1 GiB, at 1.27x eager's time
    (``benchmarks/results/h100-2026-11-25-flce/``). The gradients are computed in the forward
    and kept until backward.
    """
    check_linear_cross_entropy_inputs(hidden, weight, labels, bias, ignore_index)
    n = hidden.shape[0]
    if chunk_size is None:
        chunk_size = default_chunk_size(n, weight.shape[0])
    else:
        check_chunk_size(chunk_size)
    if n == 0:
        # No tokens: an empty sum, still connected to the graph so backward yields zeros.
        return (hidden.sum() * 0 + weight.sum() * 0).to(_compute_dtype(hidden.dtype))
    needs_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if not needs_grad:
        loss = torch.zeros((), dtype=_compute_dtype(hidden.dtype), device=hidden.device)
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            chunk_loss, _, _ = _chunk_step(hidden[start:end], weight, bias, labels[start:end], ignore_index, False)
            loss = loss + chunk_loss
        return loss
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, bias, labels, ignore_index, chunk_size)
