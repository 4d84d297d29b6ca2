"""Where ``rms_norm`` lives in a model: a one-input ``*RMSNorm`` module with a ``[H]`` weight,
whose variant (``w * x̂`` or ``x̂ * (1 + w)``) is probed from what its forward computes."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from ...binding.functions import user_override
from ...binding.place import Binder, Edits, NotBindable, Place, Survey


def _probe_rms_variant(m: nn.Module, eps: float) -> str | None:
    """Which form the module computes, read from its code, not its data: its forward runs on
    the CPU in float64 with a random stand-in weight (``torch.func.functional_call``), so a
    module on the meta device (or with any weight values) is probed the same way."""
    w = cast(torch.Tensor, m.weight)
    h = w.shape[0]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, h, dtype=torch.float64, generator=g, device="cpu")
    wf = torch.rand(h, dtype=torch.float64, generator=g, device="cpu") + 0.5
    with torch.no_grad():
        try:
            out = torch.func.functional_call(m, {"weight": wf}, (x,), strict=False).double()
        except Exception:
            return None
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if torch.allclose(out, xhat * wf, rtol=1e-4, atol=1e-6):
        return "standard"
    if torch.allclose(out, xhat * (1.0 + wf), rtol=1e-4, atol=1e-6):
        return "offset"
    return None


def find_rms_norm(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    """The RMSNorm place ``m`` is (``[]``: not an RMSNorm); ``NotBindable`` for a module that looks
    like one but computes neither form. The fused ``residual_rms_norm`` recognises a layer's norms with it."""
    cls = type(m).__name__
    weight = getattr(m, "weight", None)
    if not (cls.endswith("RMSNorm") and isinstance(weight, torch.Tensor) and weight.dim() == 1):
        return []
    eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
    if eps is None:
        return []
    if user_override(type(m), "forward"):  # never bound: what it computes does not matter
        return [Place("rms_norm", "standard", path, m, {"eps": float(eps)})]
    variant = _probe_rms_variant(m, float(eps))
    if variant is None:
        raise NotBindable(
            f"{path} ({cls}) looks like an RMSNorm but computes neither w*x̂ nor x̂*(1+w); "
            "veomni-ops cannot bind a kernel to it. Set rms_norm_implementation: eager."
        )
    return [Place("rms_norm", variant, path, m, {"eps": float(eps)})]


def _bind_rms_norm(place: Place, kernel: Callable, edits: Edits) -> None:
    eps = place.info["eps"]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return kernel(hidden_states, self.weight, eps)

    edits.forwards.append((place.module, forward))


BINDER = Binder("rms_norm", find_rms_norm, _bind_rms_norm)
