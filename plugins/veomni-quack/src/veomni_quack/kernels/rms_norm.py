"""``rms_norm`` (standard and offset) through ``quack.rmsnorm.rmsnorm``.

Quack 0.6.5's ``rmsnorm(x, weight, bias=None, residual=None, out_dtype=None,
residual_dtype=None, eps=1e-6, prenorm=False, weight_offset=0.0)`` is an autograd function
(``RMSNormFunction``): forward stores ``rstd`` (float32), backward computes dX and dW
(float32 per-SM partials summed, cast to the weight dtype). Its kernel computes

    y = (x_f32 * rstd) * (w_f32 + weight_offset)     # all in float32
    out = y.to(out_dtype)                            # out_dtype defaults to x.dtype

* ``offset`` (``x̂ * (1 + w)`` in float32, one cast at the end) is exactly that with
  ``weight_offset=1.0``.
* ``standard`` is that with ``weight_offset=0.0``. The contract (Llama casting) rounds x̂ to
  the input dtype *before* multiplying by the weight; Quack rounds once, after. In float32
  the two agree; in bf16/fp16 they differ by at most about one unit in the last place of the
  output (inside the declared tolerances; Quack's is the more accurate of the two).

The residual / prenorm / bias / per-head arguments are not used: the contract has none.

**Hidden size constraint.** Each thread copies ``gcd(H, 16 bytes / widest element)`` elements
of every tensor; when that is a single 16-bit element the CuTe compiler rejects the copy
("'cp_size' only supports (32, 64, 128), but got 16", seen on an H100 with bf16, H = 37).
So H must be even when the input or the weight is bf16/fp16 (any H with both float32).
Such shapes are refused here, before Quack is called, naming the fix (another kernel).
"""

from __future__ import annotations

import math

import torch

from ._common import CHECKS, import_quack, layout_div, to_layout

_quack_rmsnorm = import_quack("quack.rmsnorm").rmsnorm

_OP = "rms_norm"


def _check(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    CHECKS.check_rms_norm_inputs(hidden_states, weight, eps)
    h = hidden_states.shape[-1]
    if h < 1:
        raise ValueError(f"{_OP} (quack): hidden_states must be [..., H] with H >= 1, got {tuple(hidden_states.shape)}")
    widest = max(hidden_states.element_size(), weight.element_size())
    narrowest = min(hidden_states.element_size(), weight.element_size())
    if math.gcd(h, 16 // widest) * narrowest < 4:
        raise ValueError(
            f"{_OP} (quack): hidden size H = {h} is odd, which Quack 0.6.5 cannot compile for "
            f"{hidden_states.dtype} input with a {weight.dtype} weight (each thread copies at least 32 bits, "
            "i.e. 2 elements of a 16-bit dtype; CuTe: \"'cp_size' only supports (32, 64, 128), but got 16\"). "
            "Choose another rms_norm kernel for this model (e.g. 'triton' or 'eager')"
        )


def _run(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float) -> torch.Tensor:
    _check(hidden_states, weight, eps)
    shape = hidden_states.shape
    h = shape[-1]
    # Flatten here (Quack would too) so the layout check sees the 2-D tensor the kernel gets.
    x = hidden_states.reshape(-1, h)
    div = layout_div(h, x, weight)
    x = to_layout(x, div)
    w = to_layout(weight, div)
    out = _quack_rmsnorm(x, w, eps=float(eps), weight_offset=weight_offset)
    return out.reshape(shape)


def rms_norm_standard(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x̂`` (x̂ = x * rsqrt(mean(x²) + eps)), float32 math, output in ``hidden_states.dtype``."""
    return _run(hidden_states, weight, eps, 0.0)


def rms_norm_offset(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x̂ * (1 + weight)`` entirely in float32 (Quack's ``weight_offset=1.0``), cast at the end."""
    return _run(hidden_states, weight, eps, 1.0)
