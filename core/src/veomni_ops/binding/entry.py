"""``apply``: bind a plan (or a config, resolved here) into one model instance, replacing the
binding it or a module inside it holds; and :class:`ParallelWrapper`, what it asks of a parallel layout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from torch import nn

from ..config import OpsConfig, as_config
from ..device import DEVICE_ENV, DeviceInfo, current_device, detected_device, is_local
from ..lock import LockArg
from ..plan import KernelPlan
from ..target import MemoryBudget, Mode, Target
from .errors import BindingError
from .install import bind, bound_here
from .needs import features_of, survey, usable_places
from .planning import complete_plan, leave_to_model, resolve_for, target_needs
from .record import Binding
from .versions import check_transformers

if TYPE_CHECKING:
    from ..registry import Registry


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
    outer = [path for path, m in model.named_modules() if bound_here(m)]
    if outer:
        at = outer[0] or "<model>"
        raise BindingError(
            f"{owner} is bound already, as part of the binding of a module that holds it: {len(outer)} of its "
            f"modules ({at}, ...) run forwards veomni_ops.apply set there. A model has one binding, made on the "
            "module apply was given: call veomni_ops.apply on that outer module again to change the kernels, or "
            "remove its binding first (outer.veomni_ops_binding.remove()) and then apply here")
    places, skipped = usable_places(owner, cfg.for_device(dev), found)
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
    target = Target(dev, dtype=_model_dtype(model), mode=mode, needs=target_needs(places),
                    features=features_of(places), parallel=parallel.needs() if parallel is not None else None,
                    leaves_to_model=True, memory=memory)
    if given is not None:
        plan = complete_plan(given, places, target, registry)
    else:
        plan, places, skipped = leave_to_model(resolve_for(type(model).__name__, cfg, target, registry, lock),
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
    bound = bind(model, plan, places, tuple(skipped), notes, skip_logits)
    model.veomni_ops_binding = bound  # type: ignore[assignment]  # per instance, for inspection
    return bound

