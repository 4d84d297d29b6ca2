"""Putting a plan's kernels into a model: :func:`bind` picks each place's kernel, has the op's
binder record what changes (:class:`~.place.Edits`), builds every new forward, and only then
changes the model, recording in an :class:`~.record.Undo` what ``Binding.remove`` puts back."""

from __future__ import annotations

import copy
import inspect
import types
from collections.abc import Callable
from typing import Any

from torch import nn

from ..plan import KernelPlan
from .binders import BY_OP, Edits, Place, binders
from .errors import BindingError, version_hint
from .functions import RebindError, copy_with_globals, library_method
from .record import Binding, Undo

#: Set on every forward binding puts on a module (:func:`bound_here`).
BOUND = "__veomni_ops_bound__"


def bound_here(m: nn.Module) -> bool:
    """Does ``m`` run a forward a veomni-ops binding set on it?"""
    return getattr(getattr(m.__dict__.get("forward"), "__func__", None), BOUND, False)


def _pick(plan: KernelPlan, op: str, variant):
    alts = (variant,) if isinstance(variant, str) else variant
    for v in alts:
        e = plan.get(op, v)
        if e is not None:
            return v, e, plan.kernel(op, v)
    raise BindingError(
        f"the plan has no kernel for {op}/{' or '.join(alts)}, which the model needs; resolve the plan with "
        f"this model's needs (veomni_ops.apply(model, config) does that)"
    )


def _private_configs(model: nn.Module, undo: Undo) -> None:
    """Give ``model``'s modules private copies of their config objects (one copy per
    distinct object), recording the originals in ``undo``.

    transformers lets models share a config object (two models built from one config);
    binding attention sets ``config._attn_implementation`` (the mask builder follows it), which
    must not change the other model, nor the object the user holds. One deepcopy memo keeps
    sub-configs consistent: a module holding ``config.text_config`` gets the copy of it that
    the copied top config holds.
    """
    from transformers import PretrainedConfig

    memo: dict[int, Any] = {}
    for mod in model.modules():
        c = mod.__dict__.get("config")
        if isinstance(c, PretrainedConfig):
            undo.configs.append((mod, c))
            mod.config = copy.deepcopy(c, memo)  # type: ignore[assignment]  # a plain attribute


def _signature_of(fn: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` presented as ``original``: its signature (``__signature__``), ``__wrapped__`` and names,
    for the code that reads a forward's parameters (Trainer, PEFT, ``generate``)."""
    if getattr(fn, "__wrapped__", None) is original or fn is original:
        return fn
    try:
        fn.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return fn
    fn.__wrapped__ = original  # type: ignore[attr-defined]
    for name in ("__name__", "__qualname__", "__doc__"):
        setattr(fn, name, getattr(original, name, getattr(fn, name)))
    return fn


def _bind_places(plan: KernelPlan, places: list[Place], edits: Edits
                 ) -> tuple[list[tuple[str, str, str, str]], list[tuple[str, str, str]]]:
    """Each place's kernel, recorded in ``edits`` by its op's binder: (the places bound, those a
    fused kernel bound at a parent module took over, with why: ``Edits.taken``). Places come
    parent module first (``named_modules``' order), so a takeover precedes the child's place."""
    bound: list[tuple[str, str, str, str]] = []
    taken: list[tuple[str, str, str]] = []
    for p in places:
        if id(p.module) in edits.taken:
            taken.append((p.path, p.op, edits.taken[id(p.module)]))
            continue
        variant, entry, kernel = _pick(plan, p.op, p.variant)
        p.info["kernel_name"] = entry.kernel
        p.info["chosen_variant"] = variant
        BY_OP[p.op].bind(p, kernel, edits)
        bound.append((p.path, p.op, variant, entry.kernel))
    return bound, taken


def bind(model: nn.Module, plan: KernelPlan, places: list[Place], skipped, notes: list[str],
          skip_logits: bool | None) -> Binding:
    # Everything is picked and built before the model is touched: a plan that lacks a kernel,
    # or a forward that cannot be rebound, leaves the model as it was, not half bound.
    edits = Edits(skip_logits=skip_logits)
    bound, taken = _bind_places(plan, places, edits)
    for m, overrides in edits.globals.values():
        try:
            edits.forwards.append((m, copy_with_globals(type(m).forward, overrides, edits.memo)))
        except RebindError as e:
            raise BindingError(f"{type(m).__name__}.forward: {e}. {version_hint()}") from None
    for b in binders():  # what an op builds once its places are bound (the causal-LM head's forward)
        if b.finish is not None:
            b.finish(edits, plan, places, notes)
    forwards = [(m, _signature_of(fn, library_method(type(m), "forward"))) for m, fn in edits.forwards]

    # Now change the model.
    undo = Undo(model)
    root_cfg = getattr(model, "config", None)
    if any(c is not None and c._attn_implementation != mask
           for m, mask in edits.mask_names for c in (root_cfg, getattr(m, "config", None))):
        _private_configs(model, undo)
        root_cfg = getattr(model, "config", None)
        for m, mask in edits.mask_names:
            for c in (root_cfg, getattr(m, "config", None)):
                if c is None:
                    continue
                if all(c is not x for x, _ in undo.attn_names):
                    undo.attn_names.append((c, c._attn_implementation))
                c._attn_implementation = mask
        masks = ", ".join(sorted({n for _, n in edits.mask_names}))
        notes.append(f"model.config (and each module's config) is a private copy made by binding, with "
                     f"_attn_implementation {masks!r} for the bound attention's masks; the config object you "
                     "hold is unchanged, and binding.remove() puts it back")
    for m, fn in forwards:
        setattr(fn, BOUND, True)
        had = "forward" in m.__dict__
        undo.forwards.append((m, had, m.__dict__.get("forward")))
        m.forward = types.MethodType(fn, m)
    return Binding(plan, tuple(bound), (*skipped, *taken), tuple(notes), undo)
