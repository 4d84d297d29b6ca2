"""Where ``moe_experts`` lives in a model: transformers v5's routed experts, ``gate_up_proj [E, 2I, H]``
and ``down_proj [E, H, I]`` parameters around SiLU, without biases or a transposed layout."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ...binding.place import Binder, Edits, Place, Survey, is_silu


def _find_experts(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    gu = getattr(m, "gate_up_proj", None)
    if not (isinstance(gu, nn.Parameter) and gu.dim() == 3):
        return []
    dn = getattr(m, "down_proj", None)
    ok = (
        isinstance(dn, nn.Parameter) and dn.dim() == 3 and gu.shape[0] == dn.shape[0]
        and gu.shape[1] == 2 * dn.shape[2] and gu.shape[2] == dn.shape[1]
        and not getattr(m, "has_bias", False) and not getattr(m, "is_transposed", False)
        and getattr(m, "gate_up_proj_bias", None) is None
        and is_silu(getattr(m, "act_fn", None))
    )
    return [Place("moe_experts", "standard", path, m)] if ok else []


def _bind_experts(place: Place, kernel: Callable, edits: Edits) -> None:
    def forward(self, hidden_states, top_k_index, top_k_weights):
        return kernel(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj)

    edits.forwards.append((place.module, forward))


BINDER = Binder("moe_experts", _find_experts, _bind_experts)
