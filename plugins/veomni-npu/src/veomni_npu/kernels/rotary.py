"""``rotary`` contract (full and partial) -> ``torch_npu.npu_rotary_mul``.

``torch_npu.npu_rotary_mul(input, r1, r2, rotary_mode='half', rotate=None)`` (torch_npu API
reference) computes ``input * r1 + rotate(input) * r2`` where, in ``half`` mode,
``rotate(x) = cat(-x2, x1)`` for ``x1, x2 = chunk(x, 2, -1)``: exactly transformers'
``x*cos + rotate_half(x)*sin``. Documented layouts: input BNSD (our ``[B, H, S, D]``) with
r1/r2 of layout ``11SD``, ``B1SD`` or ``BNSD``; ``cos.unsqueeze(1)`` is ``[B, 1, S, R]`` =
B1SD. Limits (Atlas A2/A3): D < 896 and even; B, N < 1000; B*N <= 1024 when cos/sin need a
gradient. Autograd: op-plugin ``derivatives.yaml``: ``self, r1, r2:
npu_rotary_mul_backward(grad, self, r1, r2, rotary_mode)``. Strided inputs are fine: the
aclnn layer makes x/cos/sin contiguous itself (``l0op::Contiguous``).

* full (R == D): one ``npu_rotary_mul`` per tensor.
* partial (R < D): ``npu_rotary_mul`` on the first R channels (a strided view; the kernel
  copies it contiguous), then ``cat`` with the untouched ``D - R`` channels: one extra
  read+write of q and k beyond the kernel's own, which a fused partial kernel would avoid.

cos/sin are cast to each tensor's dtype first, as the model's rotary module does (and as
the eager reference does), so the outputs keep q's and k's dtypes.
"""

from __future__ import annotations

import torch

from ._common import CHECKS, torch_npu

_OP = "rotary"
#: npu_rotary_mul limits from the torch_npu docs (jit_compile=False, Atlas A2/A3).
MAX_HEAD_DIM = 896  # exclusive
MAX_BATCH_OR_HEADS = 1000  # exclusive
MAX_BN_WITH_COS_GRAD = 1024


def _check(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    r = CHECKS.check_rotary_inputs(q, k, cos, sin)
    b, _, _, d = q.shape
    if r >= MAX_HEAD_DIM:
        raise ValueError(
            f"{_OP} (npu): npu_rotary_mul takes a rotated dim below {MAX_HEAD_DIM}, got R = {r}; "
            "use another rotary kernel (e.g. 'eager') for this model"
        )
    cos_grad = cos.requires_grad or sin.requires_grad
    for name, x in (("q", q), ("k", k)):
        n = x.shape[1]
        if b >= MAX_BATCH_OR_HEADS or n >= MAX_BATCH_OR_HEADS:
            raise ValueError(
                f"{_OP} (npu): npu_rotary_mul takes batch and head counts below {MAX_BATCH_OR_HEADS}, got {name} "
                f"{tuple(x.shape)}; use another rotary kernel (e.g. 'eager') or a smaller micro-batch"
            )
        if cos_grad and b * n > MAX_BN_WITH_COS_GRAD:
            raise ValueError(
                f"{_OP} (npu): cos/sin require grad, and npu_rotary_mul computes their gradient only for batch*heads "
                f"<= {MAX_BN_WITH_COS_GRAD} ({name}: {b}*{n}); the contract differentiates q and k only: pass "
                "cos.detach() and sin.detach() (models compute them under torch.no_grad)"
            )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return torch_npu.npu_rotary_mul(x, cos, sin)
    rotated = torch_npu.npu_rotary_mul(x[..., :r], cos, sin)
    return torch.cat((rotated, x[..., r:]), dim=-1)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first R = ``cos.shape[-1]`` channels of every head of ``q`` and ``k``.

    ``q [B, Hq, S, D]``, ``k [B, Hk, S, D]``, ``cos``/``sin`` ``[B, S, R]``; channels past R
    pass through unchanged (partial rotary). Outputs keep q's and k's shapes and dtypes.
    """
    _check(q, k, cos, sin)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, S, R]: the documented B1SD / 11SD layout
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
