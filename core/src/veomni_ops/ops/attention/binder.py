"""Where ``attention`` lives in a model: an ``*Attention`` module whose forward calls transformers'
``ALL_ATTENTION_FUNCTIONS``; binding gives that forward a table that always returns the plan's kernel."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...binding.functions import library_method
from ...binding.place import Binder, Edits, Place, Survey, attention_forward_names
from ...target import Need


def _forward_mentions(m: nn.Module, word: str) -> bool:
    """Does the module's (library) forward name ``word``, as a global/attribute or a string?"""
    try:
        code = inspect.unwrap(library_method(type(m), "forward")).__code__
    except AttributeError:
        return False
    return word in code.co_names or word in code.co_consts


def attention_features(m: nn.Module) -> frozenset[str]:
    """What an attention kernel must honour in this module: read from the module and its config."""
    cfg = getattr(m, "config", None)
    out = set()
    if getattr(m, "attn_logit_softcapping", None) is not None:
        out.add("softcap")
    if isinstance(getattr(m, "sinks", None), torch.Tensor):
        out.add("sinks")
    window: Any
    if hasattr(m, "sliding_window"):
        window = m.sliding_window
    elif _forward_mentions(m, "sliding_window"):
        window = getattr(cfg, "sliding_window", None)  # Mistral passes getattr(self.config, "sliding_window")
    else:
        window = None
    if window is not None:
        out.add("sliding_window")
    if float(getattr(m, "attention_dropout", 0.0) or 0.0) > 0.0:
        out.add("dropout")
    return frozenset(out)


def _find_attention(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    if "ALL_ATTENTION_FUNCTIONS" not in attention_forward_names(m):
        return []
    return [Place("attention", "standard", path, m, features=attention_features(m))]


class _FixedAttention:
    """Stands in for transformers' attention table inside one model: always our kernel.

    A kernel that returns no attention weights cannot honour ``output_attentions``: asked
    for them (the call's keyword, or ``config.output_attentions``), it raises instead of
    returning ``None`` where the weights should be."""

    def __init__(self, kernel: Callable, kernel_name: str, returns_weights: bool):
        self.kernel = kernel
        self.fn = kernel if returns_weights else self._guarded
        self.kernel_name = kernel_name

    def _guarded(self, module, *args, **kwargs):
        if kwargs.get("output_attentions") or getattr(getattr(module, "config", None), "output_attentions", False):
            raise ValueError(
                f"output_attentions=True: the attention kernel {self.kernel_name!r} that veomni-ops bound into "
                f"{type(module).__name__} returns no attention weights. Bind one that does "
                "(veomni_ops.apply(model, {'attn_implementation': 'eager'})), or call "
                "model.veomni_ops_binding.remove() to run transformers' own attention."
            )
        return self.kernel(module, *args, **kwargs)

    def get_interface(self, name, default=None):
        return self.fn

    def __getitem__(self, name):
        return self.fn

    def get(self, name, default=None):
        return self.fn


def _mask_name(kernel_name: str, kernel: Callable) -> str:
    """Which transformers mask builder feeds this kernel (set as config._attn_implementation)."""
    kind = getattr(kernel, "veomni_mask", None)
    if kind:
        return kind
    return "eager" if kernel_name == "eager" else "sdpa"


def _bind_attention(place: Place, kernel: Callable, edits: Edits) -> None:
    name = place.info["kernel_name"]
    table = edits.shared(("attention-table", id(kernel), name),
                         lambda: _FixedAttention(kernel, name, returns_weights=name == "eager"))
    edits.override_global(place.module, "ALL_ATTENTION_FUNCTIONS", table)
    edits.mask_names.append((place.module, _mask_name(place.info["kernel_name"], kernel)))


def _eager_attention_asked(places: list[Place]) -> str | None:
    """Why ``auto`` takes the reference attention: the model was built with
    ``attn_implementation="eager"`` (what a user asks for to get attention weights). ``None``
    otherwise. Resolution follows it only where the config leaves attention on ``auto``."""
    paths = [p.path for p in places if p.op == "attention"
             and getattr(getattr(p.module, "config", None), "_attn_implementation", None) == "eager"]
    if not paths:
        return None
    return ("auto: the model was built with attn_implementation='eager' (attention weights, output_attentions), "
            "so its attention stays the reference kernel; name a kernel (attn_implementation: sdpa, ...) for "
            "another")


def _needs(places: list[Place], wanted: list) -> list:
    """The reference attention preferred where the model was built with eager attention."""
    asked = _eager_attention_asked(places)
    if not asked:
        return wanted
    return [dataclasses.replace(Need.of("attention", v), prefer="eager", why=asked) for v in wanted]


BINDER = Binder("attention", _find_attention, _bind_attention, needs=_needs)
