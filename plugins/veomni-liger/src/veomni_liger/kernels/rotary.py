"""``rotary`` contract -> Liger's RoPE (``liger_kernel.ops.rope``).

Liger's autograd Function is ``LigerRopeFunction.apply(q, k, cos, sin, position_ids=None,
unsqueeze_dim=1, rotary_dim=None)`` (``rotary_dim`` since 0.8.5; ``position_ids`` is
unused). It runs ``rope_forward`` / ``rope_backward`` from the same module; the adapter calls
those two inside its own small autograd Function, because both rotate **in place**: the
forward in ``q.transpose(1, 2).contiguous()``, the backward in ``dq.transpose(1, 2)
.contiguous()``. For the usual layout (q a transposed view of a ``[B, S, H, D]`` projection
output, and its gradient laid out the same way) ``contiguous()`` is a no-op, so Liger's
Function overwrites the caller's q/k in forward -- and anything autograd saved that aliases
them, without a version bump -- and overwrites the incoming gradient in backward, which is
wrong whenever autograd (or the user, through ``backward(grad_tensors)``) hands the same
gradient tensor to someone else. The adapter copies exactly those inputs/gradients once
before Liger rotates them (other layouts Liger copies itself): one extra read and write of
q and k per direction, for a functional op.

What else it adds:

* **Partial rotary** (R < D) passes ``rotary_dim=R``: the Triton kernel then rotates the
  first R channels of each head and never touches the other D - R (``_triton_rope`` masks
  loads and stores to ``rd // 2`` per half). Releases before 0.8.5 read cos/sin as if they
  were D wide -- silently wrong for R < D -- so the ``full`` kernel refuses R < D and the
  ``partial`` one needs liger-kernel >= 0.8.5 (checked at call time too).
* cos/sin of another dtype are cast to q's dtype first, as the model's rotary module does
  (Liger computes in cos's dtype).

Liger reads only the first R/2 entries of each cos/sin row: it relies on the
``cat(freqs, freqs)`` duplication the contract guarantees (a cos/sin that is not duplicated
gives a different result than the eager reference). Checking that would cost a read of
cos/sin and a host sync per call, so the adapter trusts the contract.
"""

from __future__ import annotations

import inspect

import torch
from liger_kernel.ops.rope import rope_backward, rope_forward

from ._common import CHECKS

_OP = "rotary"

#: Whether the installed Liger can rotate fewer channels than the head dim.
SUPPORTS_PARTIAL = "rotary_dim" in inspect.signature(rope_forward).parameters


def _check(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> int:
    return CHECKS.check_rotary_inputs(q, k, cos, sin)


def _private_bshd(x: torch.Tensor) -> torch.Tensor:
    """x as [B, H, S, D], backed by a ``[B, S, H, D]``-contiguous buffer no one else holds.

    Liger rotates ``x.transpose(1, 2).contiguous()`` in place; when that is already
    contiguous it is x's own storage, so copy it; otherwise Liger's ``contiguous()`` copies
    and x is passed as it is.
    """
    xt = x.transpose(1, 2)
    if xt.is_contiguous():
        return xt.clone(memory_format=torch.contiguous_format).transpose(1, 2)
    return x


class _LigerRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int | None):
        kw = {} if rotary_dim is None else {"rotary_dim": rotary_dim}
        oq, ok, cos, sin = rope_forward(_private_bshd(q), _private_bshd(k), cos, sin, **kw)
        ctx.save_for_backward(cos, sin)
        ctx.rotary_dim = rotary_dim
        return oq, ok

    @staticmethod
    def backward(ctx, dq: torch.Tensor, dk: torch.Tensor):
        cos, sin = ctx.saved_tensors
        kw = {} if ctx.rotary_dim is None else {"rotary_dim": ctx.rotary_dim}
        dq, dk = rope_backward(_private_bshd(dq), _private_bshd(dk), cos, sin, **kw)
        return dq, dk, None, None, None


def _apply(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    if cos.dtype != q.dtype:
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    return _LigerRope.apply(q, k, cos, sin, rotary_dim)


def apply_rotary_full(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate every channel of each head (``full`` variant: R == D), via Liger.

    ``q [B, Hq, S, D]``, ``k [B, Hk, S, D]``, ``cos``/``sin`` ``[B or 1, S, D]``. Returns new
    tensors with q's and k's shapes and dtypes; the inputs are left untouched.
    """
    r = _check(q, k, cos, sin)
    if r != q.shape[-1]:
        raise ValueError(
            f"{_OP} (liger, full): cos/sin have R = {r} channels but the head dim is {q.shape[-1]}; this is "
            "partial rotary -- select the 'partial' variant (the core does so for models with "
            "partial_rotary_factor < 1)"
        )
    return _apply(q, k, cos, sin, None)


def apply_rotary_partial(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first R = ``cos.shape[-1]`` channels of each head, pass the rest through (``partial``).

    Same layouts as :func:`apply_rotary_full`; R may be smaller than or equal to D.
    """
    r = _check(q, k, cos, sin)
    if not SUPPORTS_PARTIAL:
        from importlib.metadata import version as dist_version

        version = dist_version("liger-kernel")
        raise RuntimeError(
            f"{_OP} (liger, partial): the installed liger-kernel ({version}) cannot rotate fewer channels "
            'than the head dim; upgrade with pip install -U "liger-kernel>=0.8.5"'
        )
    return _apply(q, k, cos, sin, r)
