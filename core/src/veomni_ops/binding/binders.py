"""The binders, one per op: where the op lives in a transformers model, and how its kernel goes in.

Each op's binder is ``veomni_ops/ops/<op>/binder.py`` (``BINDER``, a :class:`Binder`; what a
binder is made of is :mod:`veomni_ops.binding.place`). :data:`BINDERS` gathers them, in the
ops' order with the causal-LM head's ops last; a new model family or op is a change to one
folder, not another branch here.

Places are found by structure: a one-input module with a ``[H]`` weight that computes
``w * x̂`` or ``x̂ * (1 + w)`` is an RMSNorm (probed), ``gate_proj``/``up_proj``/``down_proj``
around SiLU is a SwiGLU MLP, transformers v5's ``gate_up_proj [E, 2I, H]`` /
``down_proj [E, H, I]`` are routed experts, an ``*Attention`` module whose forward calls
``ALL_ATTENTION_FUNCTIONS`` / ``apply_rotary_pos_emb`` is attention / rotary.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

import torch
from torch import nn

from ..ops import OP_DEFS
from .functions import user_override
from .place import Binder, Edits, NotBindable, Place, Survey, head_rescales_logits

__all__ = ["BY_OP", "Binder", "Edits", "NotBindable", "Place", "Survey", "binders", "find_places",
           "head_rescales_logits", "instance_override"]


@cache
def binders() -> tuple[Binder, ...]:
    """Every op's binder (its folder's ``BINDER``), in the order places are bound: by
    ``Binder.order`` (default: the op's), the causal-LM head's ops last. Imported on first use."""
    found = [d.part("binder") for d in OP_DEFS.values()]
    for d, b in zip(OP_DEFS.values(), found):
        if not isinstance(b, Binder) or b.op != d.name:
            raise TypeError(f"{d.package}: {d.binder} must be a veomni_ops.binding.place.Binder for op {d.name!r}")
    return tuple(sorted(found, key=lambda b: (b.head, OP_DEFS[b.op].order if b.order is None else b.order)))


class _ByOp(Mapping[str, Binder]):
    """op -> its :class:`Binder`, read from the op folders on first use."""

    def __getitem__(self, op: str) -> Binder:
        for b in binders():
            if b.op == op:
                return b
        raise KeyError(op)

    def __iter__(self) -> Iterator[str]:
        return (b.op for b in binders())

    def __len__(self) -> int:
        return len(binders())


#: op -> its binder (a view of the op folders, loaded on first use).
BY_OP: Mapping[str, Binder] = _ByOp()


def __getattr__(name: str) -> Any:
    if name == "BINDERS":  # every op's binder, in the order places are bound (loaded on first use)
        return binders()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def find_places(model: nn.Module) -> list[Place]:
    """Every place in ``model`` where an op's kernel can be bound (user overrides marked ``foreign``)."""
    survey = Survey(model)
    places: list[Place] = []
    modules = list(model.named_modules())
    # The probes run on the CPU even inside a ``with torch.device("meta")`` block (how large
    # models are built, and what from_pretrained does): a default device would reach them.
    with torch.device("cpu"):
        for head in (False, True):
            for path, m in modules:
                places += [p for b in binders() if b.head is head for p in b.find(path, m, survey)]
    for p in places:
        method = BY_OP[p.op].method
        p.foreign = user_override(type(p.module), method) or instance_override(p.module, method)
    return places


def instance_override(m: nn.Module, method: str) -> str | None:
    """If other code set ``method`` on this instance (accelerate wraps ``forward`` in autocast
    that way), what it set; ``None`` if the instance runs its class's method."""
    value = m.__dict__.get(method)
    if value is None:
        return None
    if getattr(value, "__self__", None) is m and getattr(value, "__func__", None) is getattr(type(m), method, None):
        return None  # the class's own method, stored on the instance (as unpickling a bound model leaves it)
    fn = getattr(value, "__func__", value)
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    return f"{name} (set as this instance's {method})"
