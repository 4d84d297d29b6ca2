"""Fused linear cross-entropy: a Triton online-softmax pass between three GEMMs, logits never whole.

Kernel contract (``veomni_ops.hookspecs.OpHookspecs.cross_entropy``, variant ``fused_linear``)::

    kernel(hidden: Tensor[N, H], weight: Tensor[V, H], labels: LongTensor[N], *,
           bias: Tensor[V] | None = None, ignore_index: int = -100) -> Tensor[]  (float32 sum)

How, per chunk of ``C`` tokens (``C`` from :func:`chunk_tokens`, a budget on the chunk's
logits)::

    z   = h_c @ W.T (+ b)                 GEMM 1, cuBLAS, in the input dtype      [C, V]
    lse, loss_c, g = softmax(z) - onehot  one Triton program per row, float32:    in place in z
    dH[c] = g @ W                         GEMM 2, cuBLAS                           [C, H]
    dW   += g.T @ h_c                     GEMM 3, cuBLAS, float32 accumulator      [V, H]

The gradients are computed in the forward (as Liger's kernel and the core's ``chunked`` do):
three GEMMs in all, the minimum, instead of the four a recomputing backward needs; backward
only scales them by the incoming gradient. The row kernel reads each logit row twice (running
max and sum of exponentials per lane, then the gradient) and writes it once; the second read of
a row mostly hits L2 (132 rows of 300 KB in flight on an H100 fit its 50 MB).

Numerics: logits are a GEMM in the input dtype (the contract's ``z``), everything after it is
float32 (log-sum-exp, the per-row loss, the softmax); ``g`` is rounded to the input dtype once,
as eager autograd rounds the logits' gradient; ``dW`` sums the chunks in a float32 accumulator
(the core's ``add_weight_grad_``: cuBLAS ``addmm`` with ``out_dtype=float32`` on CUDA), so bf16 partial sums never lose bits;
the loss is a fixed-order float32 sum of per-row losses. No atomics: the result is
deterministic (bitwise the same from run to run on one device and shape).

Labels outside ``[0, V)`` other than ``ignore_index``: ``ValueError`` where the values can be
read without a host synchronisation (CPU, or ``VEOMNI_OPS_CHECK_VALUES=1``), otherwise -- on
CUDA, and on every device while ``torch.compile`` traces -- a device-side assertion
(``torch._assert_async``, no host sync) stops the call: on CUDA the process, on the CPU a
``RuntimeError``. The row kernel never reads outside a row either way.

Compile: the eager path is a plain ``autograd.Function``; under ``torch.compile`` the same
launchers run inside the ``veomni_triton::flce_fwd`` custom op (with a fake), which Dynamo
traces without a graph break.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from veomni_ops.kernels.checks import can_read_values, check_chunk_size, device_assert
from veomni_ops.kernels.cross_entropy import add_weight_grad_

from ..memory import CHUNK_LOGITS_BYTES, CHUNK_QUANTUM, chunk_tokens
from ._common import CHECKS, check_tensors
from .launch import eager_path, launch, next_pow2

_OP = "cross_entropy"
#: The chunk rule (:mod:`veomni_triton.memory`, torch-free: the spec's ``extra_memory`` uses it too).
__all__ = ["CHUNK_LOGITS_BYTES", "CHUNK_QUANTUM", "chunk_tokens", "fused_linear_cross_entropy_sum"]

#: Elements of a logit row one program handles per step of its loop.
ROW_BLOCK = 4096
ROW_WARPS = 16


@triton.jit
def _lse_grad_kernel(
    Z, stride_z, LABELS, LOSS, n_vocab, ignore_index,
    WANT_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    """One logit row: per-row loss ``lse - z[label]`` into LOSS, and (WANT_GRAD) the row
    overwritten with ``softmax(z) - onehot(label)`` (zero for an ignored or invalid label)."""
    row = tl.program_id(0).to(tl.int64)
    z_row = Z + row * stride_z
    label = tl.load(LABELS + row)
    valid = (label != ignore_index) & (label >= 0) & (label < n_vocab)
    offs = tl.arange(0, BLOCK)
    # per-lane running max and sum of exponentials (float32), combined once at the end
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_vocab, BLOCK):
        cols = start + offs
        z = tl.load(z_row + cols, mask=cols < n_vocab, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, z)
        # a lane that has seen only padding keeps m = -inf; shift by 0 there (-inf - -inf is NaN)
        shift = tl.where(m_new > float("-inf"), m_new, 0.0)
        s = s * tl.exp(m - shift) + tl.exp(z - shift)
        m = m_new
    m_row = tl.max(m, 0)
    s_row = tl.sum(s * tl.exp(m - m_row), 0)
    lse = m_row + tl.log(s_row)
    safe_label = tl.where(valid, label, 0)
    z_label = tl.load(z_row + safe_label).to(tl.float32)
    tl.store(LOSS + row, tl.where(valid, lse - z_label, 0.0))
    if WANT_GRAD:
        keep = valid.to(tl.float32)
        for start in range(0, n_vocab, BLOCK):
            cols = start + offs
            inside = cols < n_vocab
            z = tl.load(z_row + cols, mask=inside, other=0.0).to(tl.float32)
            p = tl.exp(z - lse)
            p = tl.where(cols == label, p - 1.0, p) * keep
            tl.store(z_row + cols, p.to(Z.dtype.element_ty), mask=inside)


def _row_pass(z: torch.Tensor, labels: torch.Tensor, loss_rows: torch.Tensor, ignore_index: int,
              want_grad: bool, index: int) -> None:
    rows, vocab = z.shape
    if rows == 0:
        return
    block = min(ROW_BLOCK, next_pow2(vocab))
    launch(index, _lse_grad_kernel, (rows,), z, z.stride(0), labels, loss_rows, vocab, ignore_index,
           WANT_GRAD=want_grad, BLOCK=block, num_warps=ROW_WARPS if block == ROW_BLOCK else 4)


def _logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.addmm(bias, h, weight.t()) if bias is not None else torch.mm(h, weight.t())


def _forward(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
    ignore_index: int, chunk: int, need_h: bool, need_w: bool, need_b: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Loss sum (float32) and, where asked, the unscaled gradients: dH in the input dtype,
    dW in float32 (in the weight's dtype when the tokens fit one chunk), db in float32."""
    n = hidden.shape[0]
    index = hidden.get_device()
    want_grad = need_h or need_w or need_b
    loss_rows = torch.empty(n, dtype=torch.float32, device=hidden.device)
    grad_h = torch.empty_like(hidden) if need_h else None
    # One chunk: dW is one GEMM, written in the weight's dtype (float32 accumulation inside
    # cuBLAS, one rounding, as eager): no float32 [V, H] buffer and no read-modify-write.
    single = n <= chunk
    grad_w = (None if single else torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)) if need_w \
        else None
    grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None

    # (Running chunk i+1's logits and row pass on a second stream beside chunk i's gradient
    # GEMMs was measured on the H100 and gained nothing: the GEMMs keep every SM busy.)
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        h = hidden[start:end]
        z = _logits(h, weight, bias)
        _row_pass(z, labels[start:end], loss_rows[start:end], ignore_index, want_grad, index)
        if grad_h is not None:
            torch.mm(z, weight, out=grad_h[start:end])
        if need_w:
            if grad_w is None:  # one chunk
                grad_w = torch.mm(z.t(), h)
            else:
                add_weight_grad_(grad_w, z, h)
        if grad_b is not None:
            grad_b.add_(z.sum(0, dtype=torch.float32))
        del z
    return loss_rows.sum(), grad_h, grad_w, grad_b


def _scaled(grad: torch.Tensor | None, scale: torch.Tensor, dtype: torch.dtype | None,
            in_place: bool = False) -> torch.Tensor | None:
    """``grad * scale`` in ``dtype``: in place where ``grad`` already has that dtype and is ours
    to overwrite (the eager path), else one pass into a new tensor (no float32 temporary)."""
    if grad is None or dtype is None:
        return None
    if in_place and grad.dtype == dtype:
        return grad.mul_(scale.to(dtype))
    return torch.mul(grad, scale.to(grad.dtype), out=torch.empty(grad.shape, dtype=dtype, device=grad.device))


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """The eager path: the launchers directly, gradients computed in forward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, ignore_index, chunk):
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        loss, gh, gw, gb = _forward(hidden, weight, bias, labels, ignore_index, chunk, need_h, need_w, need_b)
        ctx.save_for_backward(gh, gw, gb)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        gh, gw, gb = ctx.saved_tensors
        h_dtype, w_dtype, b_dtype = ctx.dtypes
        # the saved gradients are this call's alone (once_differentiable): scale them in place
        return (_scaled(gh, grad_loss, h_dtype, True), _scaled(gw, grad_loss, w_dtype, True),
                _scaled(gb, grad_loss, b_dtype, True), None, None, None)


# ---------------------------------------------------------------- custom op (torch.compile)
# A custom op cannot return None: gradients that are not needed come back as empty tensors.
def _or_empty(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return t if t is not None else like.new_empty(0, dtype=torch.float32)


@torch.library.custom_op("veomni_triton::flce_fwd", mutates_args=())
def _flce_fwd(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
    ignore_index: int, chunk: int, need_h: bool, need_w: bool, need_b: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    loss, gh, gw, gb = _forward(hidden, weight, bias, labels, ignore_index, chunk, need_h, need_w, need_b)
    return loss, _or_empty(gh, hidden), _or_empty(gw, hidden), _or_empty(gb, hidden)


@_flce_fwd.register_fake
def _(hidden, weight, bias, labels, ignore_index, chunk, need_h, need_w, need_b):
    f32 = torch.float32
    return (
        hidden.new_empty((), dtype=f32),
        hidden.new_empty(hidden.shape) if need_h else hidden.new_empty(0, dtype=f32),
        hidden.new_empty(weight.shape, dtype=weight.dtype if hidden.shape[0] <= chunk else f32) if need_w
        else hidden.new_empty(0, dtype=f32),
        hidden.new_empty(weight.shape[0], dtype=f32) if need_b else hidden.new_empty(0, dtype=f32),
    )


def _setup_context(ctx, inputs, output):
    hidden, weight, bias = inputs[:3]
    need_h, need_w, need_b = inputs[6:9]
    _, gh, gw, gb = output
    ctx.save_for_backward(gh, gw, gb)
    ctx.dtypes = (hidden.dtype if need_h else None, weight.dtype if need_w else None,
                  bias.dtype if need_b and bias is not None else None)


def _backward(ctx, grad_loss, *_unused):
    gh, gw, gb = ctx.saved_tensors
    h_dtype, w_dtype, b_dtype = ctx.dtypes
    return (_scaled(gh, grad_loss, h_dtype), _scaled(gw, grad_loss, w_dtype), _scaled(gb, grad_loss, b_dtype),
            None, None, None, None, None, None)


_flce_fwd.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------- public kernel
def _check(hidden, weight, labels, bias, ignore_index) -> None:
    tensors = (hidden, weight) if bias is None else (hidden, weight, bias)
    names = ("hidden", "weight") if bias is None else ("hidden", "weight", "bias")
    check_tensors(_OP, names, tensors)  # a device these kernels run on
    # shapes, dtypes, devices, and the label values where reading them is free (CPU) or asked for
    CHECKS.check_linear_cross_entropy_inputs(hidden, weight, labels, bias, ignore_index, always=False)


def _assert_labels_on_device(labels: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Where :func:`_check` could not read the labels (CUDA without the value-check switch, and
    any device while ``torch.compile`` traces): a device-side assertion, no host sync. Under
    compile it is a node of the graph (Inductor lowers it to a device assert), so the compiled
    path refuses such a label as the eager one does, instead of counting it as ignored."""
    if can_read_values(labels):
        return  # checked on the host already (ValueError naming the label)
    ok = ((labels >= 0) & (labels < vocab)) | (labels == ignore_index)
    device_assert(ok.all(), f"{_OP} (triton): labels holds a label outside [0, {vocab}) that is not "
                            f"ignore_index={ignore_index}")


def fused_linear_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """``sum_i CE(hidden_i @ weight.T (+ bias), labels_i)`` over ``labels_i != ignore_index``.

    float32 result; gradients for ``hidden``, ``weight`` and ``bias`` in their dtypes.
    ``chunk_size`` (tokens per chunk) defaults to :func:`chunk_tokens`.
    """
    _check(hidden, weight, labels, bias, ignore_index)
    labels = labels.contiguous()
    n, vocab = hidden.shape[0], weight.shape[0]
    if chunk_size is None:
        chunk_size = chunk_tokens(n, vocab, hidden.element_size())
    else:
        check_chunk_size(chunk_size, backend="triton")
    _assert_labels_on_device(labels, vocab, ignore_index)
    if n == 0:
        # no tokens: an empty sum, still connected to the graph so backward gives zeros
        return (hidden.sum() * 0 + weight.sum() * 0).float()
    grad = torch.is_grad_enabled()
    need_h, need_w = grad and hidden.requires_grad, grad and weight.requires_grad
    need_b = grad and bias is not None and bias.requires_grad
    if eager_path(hidden, weight, labels, *(() if bias is None else (bias,))):
        if need_h or need_w or need_b:
            return _FusedLinearCrossEntropy.apply(hidden, weight, bias, labels, ignore_index, chunk_size)
        return _forward(hidden, weight, bias, labels, ignore_index, chunk_size, False, False, False)[0]
    return _flce_fwd(hidden, weight, bias, labels, ignore_index, chunk_size, need_h, need_w, need_b)[0]
