"""Comparing a kernel's tensor with the float64 reference: the worst ratio of the error to
the tolerance at the tensor's unit scale (see :mod:`veomni_ops.testing.runner`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..spec import Tolerance

#: A kernel error up to this many times that of the core's eager kernel run in the same dtype
#: passes (step 5 of the module docstring) -- in the dtypes of :data:`BASELINE_DTYPES` only.
BASELINE_FACTOR = 2.0
#: The dtypes whose results may lean on eager's own error (step 5); float32/float64 may not.
BASELINE_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Comparison:
    """One compared tensor: ``ratio`` is the worst error in tolerance units (pass <= 1);
    ``baseline`` the same measure for the core's eager kernel in the same dtype, when it was
    needed (``ratio > 1``)."""

    name: str
    ratio: float
    max_abs: float
    scale: float
    baseline: float | None = None

    @property
    def ok(self) -> bool:
        if self.ratio <= 1.0:
            return True
        return self.baseline is not None and self.ratio <= BASELINE_FACTOR * self.baseline


#: A float64 reference whose RMS is below this is zero up to rounding (e.g. a gradient that
#: cancels exactly): it is compared at scale 1, not blown up to unit size.
ZERO_RMS = 2.0**-40


def unit_scale(ref: torch.Tensor) -> float:
    """The RMS of ``ref`` rounded to a power of two; 1 for scalars and (numerically) zero tensors."""
    if ref.numel() <= 1:
        return 1.0
    finite = ref[torch.isfinite(ref)]
    if finite.numel() == 0:
        return 1.0
    rms = float(finite.pow(2).mean().sqrt())
    if rms < ZERO_RMS or not math.isfinite(rms):
        return 1.0
    return 2.0 ** round(math.log2(rms))


def ulp(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s representable numbers at ``|b|`` (float64 tensor): ``eps * |b|``
    for normal numbers, the subnormal spacing below them."""
    if not dtype.is_floating_point or dtype == torch.float64:
        return torch.zeros_like(b)
    fi = torch.finfo(dtype)
    return torch.clamp(b.abs(), min=fi.smallest_normal) * fi.eps


def compare(name: str, got: torch.Tensor, ref: torch.Tensor, tol: Tolerance,
            mask: torch.Tensor | None = None) -> Comparison:
    """Worst ``|a - b| / (atol * s + rtol * |b|)`` of ``got`` against the float64 ``ref``."""
    a = got.detach().to(device=ref.device, dtype=torch.float64)
    b = ref.detach().to(torch.float64)
    if mask is not None:
        m = mask.to(b.device).expand_as(b)
        a, b = a[m], b[m]
    if b.numel() == 0:
        return Comparison(name, 0.0, 0.0, 1.0)
    s = unit_scale(b)
    diff = (a - b).abs()
    denom = tol.atol * s + tol.rtol * b.abs() + ulp(b, got.dtype)
    ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / denom)
    # Non-finite values: equal infinities / both NaN agree, anything else is an infinite error.
    fin_a, fin_b = torch.isfinite(a), torch.isfinite(b)
    both_nan = torch.isnan(a) & torch.isnan(b)
    same_inf = torch.isinf(a) & torch.isinf(b) & (a == b)
    nonfinite_ok = both_nan | same_inf
    ratio = torch.where(fin_a & fin_b, ratio, torch.where(nonfinite_ok, torch.zeros_like(ratio),
                                                          torch.full_like(ratio, math.inf)))
    max_abs = torch.where(fin_a & fin_b, diff, torch.where(nonfinite_ok, torch.zeros_like(diff),
                                                            torch.full_like(diff, math.inf)))
    return Comparison(name, float(ratio.max()), float(max_abs.max()), s)
