"""Where ``rotary`` lives in a model: an ``*Attention`` module whose forward calls the model's
``apply_rotary_pos_emb``, when that function is the contract's ``rotate_half`` form (probed)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ...binding.functions import function_globals, library_method
from ...binding.place import Binder, Edits, Place, Survey, attention_forward_names


def _rotary_dim(model: nn.Module) -> int | None:
    for name, m in model.named_modules():
        if name.endswith("rotary_emb") and hasattr(m, "inv_freq"):
            return int(m.inv_freq.shape[-1]) * 2
    return None


def _rotary_matches_contract(fn: Callable, head_dim: int, rot_dim: int) -> bool:
    """Is the model's ``apply_rotary_pos_emb`` the ``rotate_half`` form our contract has?"""
    from .kernel import apply_rotary

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 3, head_dim, generator=g, dtype=torch.float64, device="cpu")
    k = torch.randn(1, 1, 3, head_dim, generator=g, dtype=torch.float64, device="cpu")
    ang = torch.randn(1, 3, rot_dim // 2, generator=g, dtype=torch.float64, device="cpu")
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    try:
        got = fn(q, k, cos, sin)
        want = apply_rotary(q, k, cos, sin)
    except Exception:
        return False
    return all(torch.allclose(a, b) for a, b in zip(got, want))


def _find_rotary(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    names = attention_forward_names(m)
    rot_dim = survey.fact("rotary_dim", lambda: _rotary_dim(survey.model))
    if "apply_rotary_pos_emb" not in names or not rot_dim:
        return []
    # A forward that can also take another rotary function (DeepSeek-V3's
    # apply_rotary_pos_emb_interleave when config.rope_interleave) would leave a kernel
    # bound to apply_rotary_pos_emb unused: bind only when the config rules that out.
    other_rope = any(n.startswith("apply_rotary") and n != "apply_rotary_pos_emb" for n in names)
    if other_rope and getattr(getattr(m, "config", None), "rope_interleave", None) is not False:
        return []
    fn = function_globals(library_method(type(m), "forward")).get("apply_rotary_pos_emb")
    head_dim = int(getattr(m, "qk_rope_head_dim", 0) or getattr(m, "head_dim", 0))
    if fn is None or not head_dim:
        return []
    # Every layer shares the function: probe it once per model.
    probe = (fn, max(head_dim, rot_dim), rot_dim)
    if not survey.fact(("rotary_probe", *probe), lambda: _rotary_matches_contract(*probe)):
        return []
    variant = "partial" if rot_dim < head_dim else "full"
    return [Place("rotary", variant, path, m, {"rot_dim": rot_dim})]


def _bind_rotary(place: Place, kernel: Callable, edits: Edits) -> None:
    edits.override_global(place.module, "apply_rotary_pos_emb", kernel)


#: Listed and bound after attention (order 70), on the same modules, as since the first binders.
BINDER = Binder("rotary", _find_rotary, _bind_rotary, order=75)
