"""Where ``rotary`` lives in a model: an ``*Attention`` module whose forward calls the model's
``apply_rotary_pos_emb``, when that function is the contract's ``rotate_half`` form (probed).

An attention that calls ``apply_rotary_pos_emb`` where no kernel can go (the function fails the
probe, or the forward may call another rotary function instead) is a place left to the model's
own code, with why: the binding lists it, and a kernel named for it is refused."""

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


def _rotary_problem(fn: Callable, head_dim: int, rot_dim: int) -> str | None:
    """Why the model's ``apply_rotary_pos_emb`` is not the ``rotate_half`` form our contract has
    (``None``: it is), from what it computes on random float64 inputs on the CPU."""
    from .kernel import apply_rotary

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 3, head_dim, generator=g, dtype=torch.float64, device="cpu")
    k = torch.randn(1, 1, 3, head_dim, generator=g, dtype=torch.float64, device="cpu")
    ang = torch.randn(1, 3, rot_dim // 2, generator=g, dtype=torch.float64, device="cpu")
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    want = apply_rotary(q, k, cos, sin)
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    try:
        got = fn(q, k, cos, sin)
        same = all(torch.allclose(a, b) for a, b in zip(got, want, strict=True))
    except Exception as e:  # the model's own function: anything it raises means it is not the contract's form
        return (f"its apply_rotary_pos_emb ({name}) raised {type(e).__name__}: {e} when probed with the contract's "
                "inputs (q, k, cos, sin in rotate_half layout)")
    if not same:
        return (f"its apply_rotary_pos_emb ({name}) does not compute the contract's rotate_half form "
                "(q * cos + rotate_half(q) * sin, and the same for k), so no rotary kernel can replace it")
    return None


def _find_rotary(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    names = attention_forward_names(m)
    if "apply_rotary_pos_emb" not in names:
        return []
    rot_dim = survey.fact("rotary_dim", lambda: _rotary_dim(survey.model))
    head_dim = int(getattr(m, "qk_rope_head_dim", 0) or getattr(m, "head_dim", 0))
    variant = "partial" if rot_dim and rot_dim < head_dim else "full"

    def left(why: str) -> list[Place]:
        return [Place("rotary", variant, path, m, {"rot_dim": rot_dim}, left=why)]

    if not rot_dim:
        return left("the model has no rotary embedding module (a '*rotary_emb' with inv_freq) to read the rotary "
                    "dimension from")
    # A forward that can also take another rotary function (DeepSeek-V3's
    # apply_rotary_pos_emb_interleave when config.rope_interleave) would leave a kernel
    # bound to apply_rotary_pos_emb unused: bind only when the config rules that out.
    others = sorted(n for n in names if n.startswith("apply_rotary") and n != "apply_rotary_pos_emb")
    interleave = getattr(getattr(m, "config", None), "rope_interleave", None)
    if others and interleave is not False:
        return left(f"its forward calls {', '.join(others)} instead of apply_rotary_pos_emb when "
                    f"config.rope_interleave is set (here {interleave!r}), which a rotary kernel would not replace")
    fn = function_globals(library_method(type(m), "forward")).get("apply_rotary_pos_emb")
    if fn is None:
        return left("its forward's module defines no apply_rotary_pos_emb to replace")
    if not head_dim:
        return left(f"{type(m).__name__} has no head_dim (or qk_rope_head_dim) to probe its apply_rotary_pos_emb with")
    # Every layer shares the function: probe it once per model.
    probe = (fn, max(head_dim, rot_dim), rot_dim)
    problem = survey.fact(("rotary_probe", *probe), lambda: _rotary_problem(*probe))
    if problem is not None:
        return left(problem)
    return [Place("rotary", variant, path, m, {"rot_dim": rot_dim})]


def _bind_rotary(place: Place, kernel: Callable, edits: Edits) -> None:
    edits.override_global(place.module, "apply_rotary_pos_emb", kernel)


#: Listed and bound after attention (order 70), on the same modules, as since the first binders.
BINDER = Binder("rotary", _find_rotary, _bind_rotary, order=75)
