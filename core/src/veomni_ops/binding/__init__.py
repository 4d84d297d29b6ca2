"""Bind a :class:`KernelPlan` into one transformers model instance.

Everything is per instance: a module's ``forward`` is replaced by an instance attribute
that calls the plan's kernel directly (no lookup per call), and the attention modules run
copies of their forward whose globals name the plan's kernels (``apply_rotary_pos_emb``,
the attention table): one copy per binding and set of kernels, shared by the layers, with a
code object of its own (``binding.functions.copy_with_globals`` says why torch.compile needs
both); decorated forwards are copied through their decorators. Nothing module-level is
mutated, so two models in one process can carry different plans, and
``torch.compile(fullgraph=True)`` traces straight through.

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
import dataclasses
import inspect
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from torch import nn

from ..config import AUTO, OP_TO_FIELD, OpsConfig, as_config
from ..device import DEVICE_ENV, DeviceInfo, current_device, detected_device, is_local
from ..lock import LockArg
from ..plan import KernelPlan, PlanEntry, text_columns
from ..resolve import ResolutionError, resolve
from ..spec import split_name
from ..target import MemoryBudget, Mode, Need, Target
from .binders import BY_OP, Edits, NotBindable, Place, find_places
from .functions import RebindError, copy_with_globals, library_method
from .head import causal_lm_forward
from .versions import check_transformers

if TYPE_CHECKING:
    from ..registry import Registry

__all__ = ["Binding", "BindingError", "DroppedBinding", "ParallelWrapper", "Place", "apply", "needs_of", "survey"]


class BindingError(ValueError):
    """The plan and the model do not fit together."""


class ParallelWrapper(Protocol):
    """What :func:`apply` asks of a parallel layout (:class:`veomni_ops.parallel.ParallelRuntime`
    is one). Binding knows this shape only, so that ``parallel`` may import binding (it surveys
    the model before sharding) and binding never imports ``parallel``."""

    def needs(self) -> Mapping[str, tuple[str, ...]]:
        """Per op, what ``KernelSpec.parallel`` must declare for this layout (given to ``resolve``)."""
        ...

    def wrap_plan(self, plan: KernelPlan) -> KernelPlan:
        """``plan`` with its kernels wrapped to run under this layout."""
        ...


#: What binding changed on one module's ``forward``: the module, whether it had an instance
#: ``forward`` before (someone else's) and that value.
_ForwardUndo = tuple[nn.Module, bool, Any]


@dataclass
class _Undo:
    """What ``Binding.remove`` puts back, and the state of the binding."""

    root: nn.Module
    forwards: list[_ForwardUndo] = field(default_factory=list)
    #: (module, the config object it had before binding gave it a private copy)
    configs: list[tuple[nn.Module, Any]] = field(default_factory=list)
    #: (the private copy, the attention implementation the original named), for unpickling
    attn_names: list[tuple[Any, Any]] = field(default_factory=list)
    in_force: bool = True
    #: what remove() took out (in the order of ``configs`` and ``forwards``), for restore()
    copies: list[Any] = field(default_factory=list)
    bound_forwards: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Binding:
    """What ``apply`` did: the plan, per module path the op, variant and kernel bound, and
    the places left to the model's own code (path, op, why).

    ``remove()`` puts the model back exactly as it was. ``copy.deepcopy`` of the model keeps
    the binding in force on the copy; pickling (``torch.save`` of the whole model) does not
    carry it: the unpickled model runs transformers' own code and its ``veomni_ops_binding``
    is a :class:`DroppedBinding` saying so.
    """

    plan: KernelPlan
    bound: tuple[tuple[str, str, str, str], ...]
    skipped: tuple[tuple[str, str, str], ...] = ()
    #: other facts the printout gives (the logits path's loss kernel, a copied config)
    notes: tuple[str, ...] = ()
    _undo: _Undo | None = field(default=None, repr=False, compare=False)

    @property
    def in_force(self) -> bool:
        """Is the model still bound (not ``remove()`` d)?"""
        return self._undo is not None and self._undo.in_force

    def remove(self) -> None:
        """Restore the model as it was before ``apply``: its forwards, its config objects, no
        ``veomni_ops_binding``. Outputs are then bitwise those of the unbound model. A second
        call does nothing."""
        u = self._undo
        if u is None or not u.in_force:
            return
        u.copies = [m.__dict__["config"] for m, _ in u.configs]
        u.bound_forwards = [m.__dict__["forward"] for m, _, _ in u.forwards]
        for m, cfg in u.configs:
            m.__dict__["config"] = cfg
        for m, had, previous in reversed(u.forwards):
            if had:
                m.__dict__["forward"] = previous
            else:
                m.__dict__.pop("forward", None)
        if u.root.__dict__.get("veomni_ops_binding") is self:
            del u.root.__dict__["veomni_ops_binding"]
        u.in_force = False

    def restore(self) -> None:
        """Bind again what ``remove()`` unbound (the same forwards and config copies)."""
        u = self._undo
        if u is None or u.in_force:
            return
        for (m, _), cfg in zip(u.configs, u.copies):
            m.__dict__["config"] = cfg
        for (m, _, _), fn in zip(u.forwards, u.bound_forwards):
            m.__dict__["forward"] = fn
        u.root.__dict__["veomni_ops_binding"] = self
        u.in_force = True

    def summary(self) -> dict[str, int]:
        """Per op, how many places were bound: ``{"rms_norm": 5, "attention": 1, ...}``."""
        out: dict[str, int] = {}
        for _, op, _, _ in self.bound:
            out[op] = out.get(op, 0) + 1
        return out

    def table(self) -> str:
        """What ``print(binding)`` shows: one row per bound place (path, op, variant, kernel
        and where it comes from), then the places left to the model's own code, with why."""
        state = "" if self.in_force else " (removed: the model runs its own code again)"
        head = (f"Binding for {self.plan.device.describe()}, mode {self.plan.mode.execution}{state}: "
                f"{len(self.bound)} place(s) bound"
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
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def __deepcopy__(self, memo: dict[int, Any]) -> Binding:
        # The copied model's forwards are rebound to its own modules (Python copies bound
        # methods that way): the copy is bound too, and its binding undoes the copy.
        undo = copy.deepcopy(self._undo, memo)
        return Binding(self.plan, self.bound, self.skipped, self.notes, undo)

    def __copy__(self) -> Binding:
        return self

    def __reduce__(self):
        # Kernels are not carried by pickle: the bound forwards pickle as "the module's
        # forward", which is transformers' own on unpickling. Say so, and give the config
        # copies their original attention implementation back.
        names = [] if self._undo is None or not self._undo.in_force else self._undo.attn_names
        return (_dropped_binding, (self.bound, self.skipped, names))


@dataclass(frozen=True)
class DroppedBinding:
    """The ``veomni_ops_binding`` of a model that was pickled while bound (``torch.save`` of the
    whole model): nothing is bound; ``bound`` says what was."""

    bound: tuple[tuple[str, str, str, str], ...]
    skipped: tuple[tuple[str, str, str], ...] = ()
    in_force: bool = False

    def summary(self) -> dict[str, int]:
        return {}

    def remove(self) -> None:
        """Nothing to remove."""

    def table(self) -> str:
        return (f"veomni-ops binding not in force: the model was pickled while bound ({len(self.bound)} place(s)), "
                "and pickling does not carry kernels, so it runs transformers' own code. Call "
                "veomni_ops.apply(model, config) again to bind it (or save model.state_dict() and bind after loading).")

    def __str__(self) -> str:
        return self.table()


def _dropped_binding(bound, skipped, attn_names) -> DroppedBinding:
    for cfg, name in attn_names:
        cfg._attn_implementation = name
    return DroppedBinding(tuple(bound), tuple(skipped))


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


def model_needs(model: nn.Module, config: OpsConfig | Mapping[str, Any] | str | None = None
                ) -> tuple[dict[str, list], dict[str, frozenset[str]]]:
    """What binding ``config`` into ``model`` asks resolution for: per op the variants its places
    need (:func:`needs_of`) and the features they need (:func:`features_of`), over the places
    binding would fill (not those it leaves to the model's or your code)."""
    cfg = as_config(config)
    places, _ = _usable_places(type(model).__name__, cfg, survey(model))
    return needs_of(places), features_of(places)


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
    parallel: ParallelWrapper | None = None,
    skip_logits: bool | None = None,
    lock: LockArg = None,
    memory: MemoryBudget | None = None,
) -> Binding:
    """Resolve (if given a config) and bind kernels into ``model``. Returns a :class:`Binding`
    (also ``model.veomni_ops_binding``); ``binding.remove()`` undoes it.

    ``model`` may be a transformers model or any module holding one (a PEFT model, your own
    wrapper, a ``torch.compile`` d module): every place inside it is bound, the causal-LM
    head included. Each bound ``forward`` keeps the signature of the one it replaces.

    ``compile=True``: the model will be run under ``torch.compile``; ``auto`` takes only
    kernels whose spec says ``supports_compile`` and a named one that does not is refused.
    An explicit non-eager kernel for an op the model has no place for raises
    :class:`BindingError`; with ``auto`` such ops are simply not bound, and a place no
    kernel can serve here is left to the model's own code (the binding lists it, with why).

    ``skip_logits``: the causal-LM head's fused loss (no logits) runs by default only when
    training with labels and autograd on, and ``return_dict`` is not ``False``; ``True`` always
    takes it when labels are given (``logits`` is ``None``), ``False`` never (logits always).
    One call can say the same: ``model(..., skip_logits=True)``.

    ``parallel``: a :class:`~veomni_ops.parallel.ParallelRuntime` (any :class:`ParallelWrapper`:
    ``needs()`` and ``wrap_plan(plan)``): resolution takes only kernels whose spec declares what the
    layout needs, and the plan's kernels are wrapped for it (Ulysses, expert parallelism)
    before they are bound.

    ``lock``: a plan lock (``veomni-ops tune``; see :mod:`veomni_ops.lock`): a path or a
    :class:`~veomni_ops.lock.PlanLock` (one that does not match this device, these versions, this
    mode and the model's dtype is an error), ``None`` (``VEOMNI_OPS_LOCK`` if set; ignored with a
    warning where it does not match) or ``False`` (no lock). Its choices take the ops the config
    leaves on ``auto``.

    ``memory``: a :class:`~veomni_ops.target.MemoryBudget` (the device memory free for the job and
    the shapes each op runs at): ``auto`` passes over a kernel whose declared extra memory does not
    fit it, for the next usable one (the plan entry's reason says so). ``None``: not considered.
    """
    _check_model(model, config_or_plan)
    check_transformers(type(model))
    if skip_logits not in (None, True, False):
        raise BindingError(f"skip_logits must be None, True or False, got {skip_logits!r}")
    held = _bindings_in(model)
    # A second apply replaces the first, and so does an apply on a module holding a bound one (a
    # wrapper, a PEFT model made after binding): unbind, then bind; if binding fails, they come back.
    for _, b in held:
        b.remove()
    try:
        return _apply(model, config_or_plan, device=device, registry=registry, training=training, compile=compile,
                      parallel=parallel, skip_logits=skip_logits, lock=lock, memory=memory,
                      replaced=[path for path, _ in held if path])
    except BaseException:
        if not getattr(model.__dict__.get("veomni_ops_binding"), "in_force", False):
            for _, b in reversed(held):
                b.restore()
        raise


def _check_model(model: Any, config_or_plan: Any) -> None:
    """Refuse what ``apply`` cannot bind before anything else runs: not a module at all (a
    string, a model class, the arguments swapped)."""
    if isinstance(model, nn.Module):
        return
    what = f"{type(model).__module__}.{type(model).__qualname__}"
    if isinstance(model, type) and issubclass(model, nn.Module):
        fix = (f"got the class {model.__qualname__} itself; build the model first (e.g. "
               f"{model.__name__}.from_pretrained(...), or AutoModelForCausalLM.from_config(config)) and pass it")
    elif isinstance(config_or_plan, nn.Module):
        fix = f"got a {what} first and the model second; write veomni_ops.apply(model, config)"
    else:
        fix = f"got a {what} ({model!r:.80})"
    raise TypeError(f"veomni_ops.apply(model, config): model must be a torch.nn.Module: {_EXPECTED}; {fix}")


#: What ``apply`` binds into, for its refusals.
_EXPECTED = ("a transformers model (a PreTrainedModel, e.g. from AutoModelForCausalLM.from_pretrained; VeOmni's "
             "models are ones), or a module holding one (a PEFT model, your own wrapper, a torch.compile'd module)")


def _bindings_in(model: nn.Module) -> list[tuple[str, Binding]]:
    """Every binding in force on ``model`` or on a module inside it, with its module's path
    (``""``: ``model`` itself)."""
    out = []
    for path, m in model.named_modules():
        b = m.__dict__.get("veomni_ops_binding")
        if isinstance(b, Binding) and b.in_force:
            out.append((path, b))
    return out


#: Set on every forward binding puts on a module (:func:`_bound_here`).
_BOUND = "__veomni_ops_bound__"


def _bound_here(m: nn.Module) -> bool:
    """Does ``m`` run a forward a veomni-ops binding set on it?"""
    return getattr(getattr(m.__dict__.get("forward"), "__func__", None), _BOUND, False)


def _holds_transformers_model(model: nn.Module) -> bool:
    from transformers import PreTrainedModel

    return any(isinstance(m, PreTrainedModel) for m in model.modules())


def _apply(model: nn.Module, config_or_plan: KernelPlan | OpsConfig | Mapping[str, Any] | str | None, *,
           device: DeviceInfo | str | None, registry: Registry | None, training: bool, compile: bool,
           parallel: ParallelWrapper | None, skip_logits: bool | None, lock: LockArg, memory: MemoryBudget | None,
           replaced: list[str]) -> Binding:
    """:func:`apply` on a model no binding holds (``replaced``: the paths of the modules whose
    bindings this one replaces)."""
    cfg = _config_of(config_or_plan)
    given = config_or_plan if isinstance(config_or_plan, KernelPlan) else None
    dev = given.device if given is not None else current_device(device)
    found = survey(model)
    owner = type(model).__name__
    notes_before = [f"replaced the binding veomni_ops.apply made on {path} ({type(model.get_submodule(path)).__name__}): "
                    f"one binding per model, and this one covers {path}" for path in replaced]
    if not _holds_transformers_model(model):
        if not found:
            raise BindingError(
                f"{owner} is not a transformers model and holds none, and veomni-ops found no place in it to bind "
                f"a kernel (no RMSNorm, SwiGLU MLP, attention, rotary, experts or causal-LM head): apply would bind "
                f"nothing. veomni_ops.apply expects {_EXPECTED}; pass that model")
        notes_before.append(f"{owner} is not a transformers model and holds none: veomni-ops bound the places it "
                            f"recognised by their structure ({len(found)}, listed above); the model-level parts "
                            "(the causal-LM head and its loss, the attention masks) live in a transformers model")
    outer = [path for path, m in model.named_modules() if _bound_here(m)]
    if outer:
        at = outer[0] or "<model>"
        raise BindingError(
            f"{owner} is bound already, as part of the binding of a module that holds it: {len(outer)} of its "
            f"modules ({at}, ...) run forwards veomni_ops.apply set there. A model has one binding, made on the "
            "module apply was given: call veomni_ops.apply on that outer module again to change the kernels, or "
            "remove its binding first (outer.veomni_ops_binding.remove()) and then apply here")
    places, skipped = _usable_places(owner, cfg.for_device(dev), found)
    if given is not None:
        if compile and not given.compile:
            raise BindingError("this plan was resolved without compile=True; resolve it again with compile=True, "
                               "or pass apply(model, config, compile=True)")
        if lock is not None and lock is not False:
            raise BindingError("a plan lock applies when resolving: pass apply(model, config, lock=...), not a "
                               "resolved plan (or resolve the plan with resolve(config, lock=...))")
        if memory is not None:
            raise BindingError("a memory budget applies when resolving: pass apply(model, config, memory=...), not "
                               "a resolved plan (or resolve the plan with resolve(config, Target(..., memory=...)))")
    # One target for the model: what its places need, in its dtype and mode, under its parallel layout.
    mode = Mode.of(training=training, compile=given.compile if given is not None else compile)
    target = Target(dev, dtype=_model_dtype(model), mode=mode, needs=_target_needs(places),
                    features=features_of(places), parallel=parallel.needs() if parallel is not None else None,
                    leaves_to_model=True, memory=memory)
    if given is not None:
        plan = _with_logits_kernel(given, places, target, registry)
    else:
        plan, places, skipped = _leave_to_model(_resolve_for(type(model).__name__, cfg, target, registry, lock),
                                                places, skipped)
        if not is_local(dev):  # after resolution, so that the config's own mistakes are all said first
            here = detected_device()
            raise BindingError(
                f"{owner}: apply binds kernels that run on this machine ({here}), and the device to resolve for is "
                f"{dev.describe()}, another machine's. "
                + (f"Unset {DEVICE_ENV} (planning for another machine is veomni-ops resolve's), or pass "
                   f"apply(..., device='{here}')" if dev.from_env else
                   f"Pass device='{here}' (or leave it out); to plan for {dev}, use veomni_ops.resolve"))
    notes = [*plan.notes, *notes_before]
    if parallel is not None:
        plan = parallel.wrap_plan(plan)
    bound = _bind(model, plan, places, tuple(skipped), notes, skip_logits)
    model.veomni_ops_binding = bound  # type: ignore[assignment]  # per instance, for inspection
    return bound


def _usable_places(owner: str, cfg: OpsConfig, places: list[Place]) -> tuple[list[Place], list[tuple[str, str, str]]]:
    """The places binding may fill, and those it leaves (path, op, why). A named kernel for a
    place that must be left, or for an op the model has no place for, is refused."""
    # Places no kernel can go (e.g. an adapter on lm_head): reported; a named kernel for one is refused.
    left = [p for p in places if p.left]
    refused_left = [p for p in left if _named(cfg, p.op) and _kernel(cfg, p.op) != "eager"]
    if refused_left:
        raise BindingError(f"{owner}: no kernel can be bound where the config names one:\n"
                           + "\n".join(f"  - {OP_TO_FIELD[p.op]}={cfg.for_op(p.op)!r} at {p.path or '<model>'}: "
                                       f"{p.left}" for p in refused_left)
                           + "\nSet those fields to 'auto' or 'eager' (the model's own code then runs there).")
    skipped = [(p.path, p.op, cast(str, p.left)) for p in left]
    places = [p for p in places if not p.left]

    # User code: a named non-eager kernel for an overridden method is refused; otherwise the
    # place is left to the user's code (eager *is* what that code computes around).
    foreign = [p for p in places if p.foreign]
    refused = [p for p in foreign if _named(cfg, p.op) and _kernel(cfg, p.op) != "eager"]
    if refused:
        lines = [f"  - {OP_TO_FIELD[p.op]}={cfg.for_op(p.op)!r}: {p.foreign} is user code "
                 f"(module {p.path or '<model>'}); binding would replace it" for p in refused]
        raise BindingError(
            f"{owner}: veomni-ops will not replace methods your code overrides:\n" + "\n".join(lines)
            + "\nSet those fields to 'auto' or 'eager' to keep your code (the op then runs as your method does), "
            "or move your change out of the overriding method (e.g. add loss terms outside model.forward)."
        )
    skipped += [(p.path, p.op, f"user code: {p.foreign}") for p in foreign]
    places = [p for p in places if not p.foreign]

    have_ops = {p.op for p in places}
    unplaced = [
        f"{OP_TO_FIELD[op]}={cfg.for_op(op)!r}"
        for op in OP_TO_FIELD
        if _kernel(cfg, op) not in (AUTO, "eager") and op not in have_ops
    ]
    if unplaced:
        raise BindingError(
            f"{owner} has no place for: {', '.join(unplaced)}. The model has no module for that op "
            f"(or not in a form veomni-ops can bind; {_version_hint()}); set the field to 'auto' or 'eager'."
        )
    return places, skipped


#: What the causal-LM head needs beside its loss kernel: a logits kernel for the logits path
#: (evaluation, generation, ``return_dict=False``), the configured kernel's logits variant or,
#: where the kernel the config names has none, the reference's.
LOGITS_PATH = Need(("logits",), fallback="eager", why="where the head returns logits (evaluation, no grad, "
                   "return_dict=False, skip_logits=False) the loss is computed from them by the reference kernel "
                   "(eager)")


def _target_needs(places: list[Place]) -> dict[str, list]:
    """What resolution must provide for ``places`` (:func:`needs_of`), with what the model asks
    beside: the reference attention where it was built with eager attention, and the head's logits path."""
    needs: dict[str, list] = needs_of(places)
    asked = _eager_attention_asked(places)
    if asked and "attention" in needs:
        needs["attention"] = [dataclasses.replace(Need.of("attention", v), prefer="eager", why=asked)
                              for v in needs["attention"]]
    if "cross_entropy" in needs:
        needs["cross_entropy"] = [*needs["cross_entropy"], LOGITS_PATH]
    return needs


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


def _resolve_for(owner: str, cfg: OpsConfig, target: Target, registry: Registry | None, lock: LockArg) -> KernelPlan:
    """The plan for ``target``: one resolution; a refusal says what the model's places need."""
    try:
        return resolve(cfg, target, registry=registry, lock=lock)
    except ResolutionError as e:
        refused = {r.op for r in e.refusals}
        feats = _describe_features({op: f for op, f in target.features.items() if op in refused})
        if feats:
            e.add_note(f"(while binding {owner}: its places need {feats})")
        raise


def _leave_to_model(plan: KernelPlan, places: list[Place], skipped: list[tuple[str, str, str]]
                    ) -> tuple[KernelPlan, list[Place], list[tuple[str, str, str]]]:
    """The places ``plan`` leaves to the model's own code (an op on ``auto`` with no kernel usable
    here), moved to ``skipped`` with why; where that is the head's loss, its auxiliary loss too."""
    left = dict(plan.left)
    if "cross_entropy" in left:  # the auxiliary loss is computed by the head
        left.setdefault("load_balancing_loss", left["cross_entropy"])
        plan = dataclasses.replace(plan, entries=tuple(e for e in plan.entries if e.op not in left))
    skipped = [*skipped, *((p.path, p.op, f"auto: {left[p.op]}") for p in places if p.op in left)]
    return plan, [p for p in places if p.op not in left], skipped


def _with_logits_kernel(plan: KernelPlan, places: list[Place], target: Target, registry: Registry | None) -> KernelPlan:
    """A plan given to ``apply``, with a ``cross_entropy/logits`` kernel for the head's logits path
    where it has a fused_linear one and no logits one (:data:`LOGITS_PATH`)."""
    if (not any(p.op == "cross_entropy" for p in places) or plan.get("cross_entropy", "fused_linear") is None
            or plan.get("cross_entropy", "logits") is not None):
        return plan
    logits = Target(target.device, dtype=target.dtype, mode=target.mode, parallel=target.parallel,
                    needs={"cross_entropy": [LOGITS_PATH]})
    extra = resolve(plan.config, logits, registry=registry, lock=False)  # the plan was resolved already, lock or not
    return dataclasses.replace(plan, entries=(*plan.entries, *extra.entries), notes=(*plan.notes, *extra.notes))


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


def _private_configs(model: nn.Module, undo: _Undo) -> None:
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


def _bind(model: nn.Module, plan: KernelPlan, places: list[Place], skipped, notes: list[str],
          skip_logits: bool | None) -> Binding:
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
            edits.forwards.append((m, copy_with_globals(type(m).forward, overrides, edits.memo)))
        except RebindError as e:
            raise BindingError(f"{type(m).__name__}.forward: {e}. {_version_hint()}") from None
    for head in edits.head.values():
        m = head["module"]
        variant, ce = head["ce"]
        logits_kernel = ce if variant == "logits" else plan.kernel("cross_entropy", "logits")
        at = next(p.path for p in places if p.module is m and p.op == "cross_entropy") or "<model>"
        logits_name = cast(PlanEntry, plan.get("cross_entropy", "logits")).kernel
        if variant == "fused_linear":
            notes.append(f"cross_entropy at {at}: fused_linear {plan.get('cross_entropy', variant).kernel} "  # type: ignore[union-attr]
                         f"(logits=None) when training with labels and autograd on (skip_logits={skip_logits}); "
                         f"otherwise the model's logits, and the loss from them by {logits_name}")
        edits.forwards.append((m, causal_lm_forward(
            library_method(type(m), "forward"), fused=ce if variant == "fused_linear" else None,
            logits=logits_kernel, lbl=head.get("lbl"), skip_logits=skip_logits, owner=type(m).__name__)))
    forwards = [(m, _signature_of(fn, library_method(type(m), "forward"))) for m, fn in edits.forwards]

    # Now change the model.
    undo = _Undo(model)
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
        setattr(fn, _BOUND, True)
        had = "forward" in m.__dict__
        undo.forwards.append((m, had, m.__dict__.get("forward")))
        m.forward = types.MethodType(fn, m)
    return Binding(plan, tuple(bound), skipped, tuple(notes), undo)


def _version_hint() -> str:
    from .versions import describe_support

    return describe_support()
