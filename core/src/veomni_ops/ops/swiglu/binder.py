"""Where ``swiglu`` lives in a model: an MLP with ``gate_proj``/``up_proj``/``down_proj`` around SiLU."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ...binding.place import Binder, Edits, Place, Survey, is_silu


def _find_swiglu(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    if all(isinstance(getattr(m, p, None), nn.Linear) for p in ("gate_proj", "up_proj", "down_proj")):
        if is_silu(getattr(m, "act_fn", None)):
            return [Place("swiglu", "standard", path, m)]
    return []


def _bind_swiglu(place: Place, kernel: Callable, edits: Edits) -> None:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(kernel(self.gate_proj(x), self.up_proj(x)))
        # Seed-OSS applies dropout to the MLP output inside the MLP; keep it.
        p = getattr(self, "residual_dropout", 0.0)
        if p:
            out = nn.functional.dropout(out, p=p, training=self.training)
        return out

    edits.forwards.append((place.module, forward))


BINDER = Binder("swiglu", _find_swiglu, _bind_swiglu)
