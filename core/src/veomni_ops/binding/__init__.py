"""Bind a :class:`KernelPlan` into one transformers model instance.

Everything is per instance: a module's ``forward`` is replaced by an instance attribute
that calls the plan's kernel directly (no lookup per call), and the attention modules run
per-instance copies of their forward whose globals name the plan's kernels
(``apply_rotary_pos_emb``, the attention table); decorated forwards are copied through
their decorators. Nothing module-level is mutated, so two models in one process can carry
different plans, and ``torch.compile(fullgraph=True)`` traces straight through.

Where each op lives is one :class:`~veomni_ops.binding.binders.Binder` per op
(:data:`~veomni_ops.binding.binders.BINDERS`). What each place needs is read from the
model: the RMSNorm variant by probing the module, the rotary variant from the rotary
dimension, the attention features (softcap, sinks, sliding window, dropout) from each
attention module. ``auto`` only takes a kernel that honours them; a named kernel that
cannot is refused here, not at the first forward.

User code is never replaced: a method a user's subclass overrides is not bound (a named
kernel for it is refused, naming the class and the method). The transformers version is
checked against the range this release supports (:mod:`.versions`).
"""

from __future__ import annotations

import copy
import inspect
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from ..config import AUTO, OP_TO_FIELD, OpsConfig, as_config
from ..device import DeviceInfo, current_device
from ..plan import KernelPlan, text_columns
from ..resolve import ResolutionError, resolve
from ..spec import split_name
from .binders import BY_OP, Edits, NotBindable, Place, find_places
from .functions import RebindError, copy_with_globals
from .head import causal_lm_forward
from .versions import check_transformers

if TYPE_CHECKING:
    from ..parallel.runtime import ParallelRuntime
    from ..registry import Registry

__all__ = ["Binding", "BindingError", "Place", "apply", "needs_of", "survey"]


class BindingError(ValueError):
    """The plan and the model do not fit together."""


@dataclass(frozen=True)
class Binding:
    """What ``apply`` did: the plan, per module path the op, variant and kernel bound, and
    the places left to the model's own code (path, op, why)."""

    plan: KernelPlan
    bound: tuple[tuple[str, str, str, str], ...]
    skipped: tuple[tuple[str, str, str], ...] = ()

    def summary(self) -> dict[str, int]:
        """Per op, how many places were bound: ``{"rms_norm": 5, "attention": 1, ...}``."""
        out: dict[str, int] = {}
        for _, op, _, _ in self.bound:
            out[op] = out.get(op, 0) + 1
        return out

    def table(self) -> str:
        """What ``print(binding)`` shows: one row per bound place (path, op, variant, kernel
        and where it comes from), then the places left to the model's own code, with why."""
        head = (f"Binding for {self.plan.device}, mode {self.plan.mode}: {len(self.bound)} place(s) bound"
                + (f", {len(self.skipped)} left to the model's own code" if self.skipped else ""))
        rows = [("path", "op", "variant", "kernel")]
        for path, op, variant, kernel in self.bound:
            e = self.plan.get(op, variant)
            rows.append((path or "<model>", op, variant, kernel + (f" ({e.distribution})" if e is not None else "")))
        lines = [head, *text_columns(rows, indent="  ")]
        if self.skipped:
            lines.append("left to the model's own code:")
            lines += text_columns([("path", "op", "why")] + [(p or "<model>", op, why) for p, op, why in self.skipped],
                                 indent="  ")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def survey(model: nn.Module) -> list[Place]:
    """Every place in ``model`` where an op's kernel can be bound, with the variant it needs."""
    try:
        return find_places(model)
    except NotBindable as e:
        raise BindingError(f"{type(model).__name__}: {e} ({_version_hint()})") from None


def needs_of(places: list[Place]) -> dict[str, list]:
    """What resolution must provide for these places: per op, the variants needed."""
    needs: dict[str, list] = {}
    for p in places:
        lst = needs.setdefault(p.op, [])
        if p.variant not in lst:
            lst.append(p.variant)
    return needs


def features_of(places: list[Place]) -> dict[str, frozenset[str]]:
    """Per op, every feature some place of that op needs (one kernel serves them all)."""
    out: dict[str, frozenset[str]] = {}
    for p in places:
        if p.features:
            out[p.op] = out.get(p.op, frozenset()) | p.features
    return out


def _model_dtype(model: nn.Module) -> str | None:
    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return None


def _config_of(config_or_plan) -> OpsConfig:
    if isinstance(config_or_plan, KernelPlan):
        return config_or_plan.config
    if isinstance(config_or_plan, OpsConfig):
        return config_or_plan
    return as_config(config_or_plan)


def _named(cfg: OpsConfig, op: str) -> bool:
    """Did the config name a kernel for ``op`` (not ``auto``)?"""
    return cfg.for_op(op) != AUTO


def _kernel(cfg: OpsConfig, op: str) -> str:
    """The kernel the config names for ``op``, without a distribution qualifier
    (``eager@veomni-ops`` is ``eager``)."""
    return split_name(cfg.for_op(op))[0]


def apply(
    model: nn.Module,
    config_or_plan: KernelPlan | OpsConfig | Mapping[str, Any] | str | None = None,
    *,
    device: DeviceInfo | str | None = None,
    registry: Registry | None = None,
    training: bool = True,
    compile: bool = False,
    parallel: ParallelRuntime | None = None,
) -> Binding:
    """Resolve (if given a config) and bind kernels into ``model``. Returns a :class:`Binding`.

    ``compile=True``: the model will be run under ``torch.compile``; ``auto`` takes only
    kernels whose spec says ``supports_compile`` and a named one that does not is refused.
    An explicit non-eager kernel for an op the model has no place for raises
    :class:`BindingError`; with ``auto`` such ops are simply not bound.

    ``parallel``: a :class:`~veomni_ops.parallel.ParallelRuntime` (anything with ``needs()``
    and ``wrap_plan(plan)``): resolution takes only kernels whose spec declares what the
    layout needs, and the plan's kernels are wrapped for it (Ulysses, expert parallelism)
    before they are bound.
    """
    check_transformers(type(model))
    places = survey(model)
    cfg = _config_of(config_or_plan)
    if _kernel(cfg, "cross_entropy") == "eager":
        # The reference means "what transformers does": logits, then the loss (and the
        # logits are returned). Other kernels prefer the fused form, which never holds them.
        for p in places:
            if p.op == "cross_entropy":
                p.variant = ("logits", "fused_linear")

    # User code: a named non-eager kernel for an overridden method is refused; otherwise the
    # place is left to the user's code (eager *is* what that code computes around).
    foreign = [p for p in places if p.foreign]
    refused = [p for p in foreign if _named(cfg, p.op) and _kernel(cfg, p.op) != "eager"]
    if refused:
        lines = [f"  - {OP_TO_FIELD[p.op]}={cfg.for_op(p.op)!r}: {p.foreign} is user code "
                 f"(module {p.path or '<model>'}); binding would replace it" for p in refused]
        raise BindingError(
            f"{type(model).__name__}: veomni-ops will not replace methods your code overrides:\n" + "\n".join(lines)
            + "\nSet those fields to 'auto' or 'eager' to keep your code (the op then runs as your method does), "
            "or move your change out of the overriding method (e.g. add loss terms outside model.forward)."
        )
    skipped = tuple((p.path, p.op, f"user code: {p.foreign}") for p in foreign)
    places = [p for p in places if not p.foreign]

    have_ops = {p.op for p in places}
    unplaced = [
        f"{OP_TO_FIELD[op]}={cfg.for_op(op)!r}"
        for op in OP_TO_FIELD
        if _kernel(cfg, op) not in (AUTO, "eager") and op not in have_ops
    ]
    if unplaced:
        raise BindingError(
            f"{type(model).__name__} has no place for: {', '.join(unplaced)}. The model has no module for that op "
            f"(or not in a form veomni-ops can bind; {_version_hint()}); set the field to 'auto' or 'eager'."
        )
    if isinstance(config_or_plan, KernelPlan):
        plan = config_or_plan
        if compile and not plan.compile:
            raise BindingError("this plan was resolved without compile=True; resolve it again with compile=True, "
                               "or pass apply(model, config, compile=True)")
    else:
        try:
            plan = resolve(cfg, current_device(device), needs=needs_of(places), features=features_of(places),
                           registry=registry, dtype=_model_dtype(model), training=training, compile=compile,
                           parallel=parallel.needs() if parallel is not None else None)
        except ResolutionError as e:
            _add_note(e, f"(while binding {type(model).__name__}: its places need "
                         f"{_describe_features(features_of(places)) or 'no extra features'})")
            raise
    if parallel is not None:
        plan = parallel.wrap_plan(plan)
    bound = _bind(model, plan, places, skipped)
    model.veomni_ops_binding = bound  # type: ignore[assignment]  # per instance, for inspection
    return bound


def _add_note(e: BaseException, note: str) -> None:
    """``e.add_note(note)``; before Python 3.11, which has no exception notes, the note is
    appended to the message."""
    if sys.version_info >= (3, 11):
        e.add_note(note)
    else:
        e.args = (f"{e}\n{note}", *e.args[1:])


def _describe_features(feats: Mapping[str, frozenset[str]]) -> str:
    return "; ".join(f"{op}: {', '.join(sorted(f))}" for op, f in feats.items())


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


def _own_configs(model: nn.Module) -> None:
    """Give ``model`` private copies of its config objects (one copy per distinct object).

    transformers lets models share a config object (two models built from one config);
    binding attention sets ``config._attn_implementation`` (the mask builder follows it), which
    must not change the other model. One deepcopy memo keeps sub-configs consistent: a module
    holding ``config.text_config`` gets the copy of it that the copied top config holds.
    """
    from transformers import PretrainedConfig

    memo: dict[int, Any] = {}
    for mod in model.modules():
        c = mod.__dict__.get("config")
        if isinstance(c, PretrainedConfig):
            mod.config = copy.deepcopy(c, memo)  # type: ignore[assignment]  # a plain attribute


def _bind(model: nn.Module, plan: KernelPlan, places: list[Place], skipped) -> Binding:
    # Everything is picked and built before the model is touched: a plan that lacks a kernel,
    # or a forward that cannot be rebound, leaves the model as it was, not half bound.
    edits = Edits()
    bound: list[tuple[str, str, str, str]] = []
    for p in places:
        variant, entry, kernel = _pick(plan, p.op, p.variant)
        p.info["kernel_name"] = entry.kernel
        p.info["chosen_variant"] = variant
        BY_OP[p.op].bind(p, kernel, edits)
        bound.append((p.path, p.op, variant, entry.kernel))
    for m, overrides in edits.globals.values():
        try:
            edits.forwards.append((m, copy_with_globals(type(m).forward, overrides)))
        except RebindError as e:
            raise BindingError(f"{type(m).__name__}.forward: {e}. {_version_hint()}") from None
    if "ce" in edits.head:
        sig = inspect.signature(type(model).forward)
        edits.forwards.append((model, causal_lm_forward(edits.head["ce"], edits.head.get("lbl"), sig)))

    # Now change the model.
    if edits.mask_names:
        _own_configs(model)
    for m, mask in edits.mask_names:
        cfg = getattr(model, "config", None)
        sub = getattr(m, "config", None)
        for c in {id(x): x for x in (cfg, sub) if x is not None}.values():
            c._attn_implementation = mask
    for m, fn in edits.forwards:
        m.forward = types.MethodType(fn, m)
    return Binding(plan, tuple(bound), skipped)


def _version_hint() -> str:
    from .versions import describe_support

    return describe_support()
