"""What an op's binder is made of: :class:`Place`, :class:`Edits`, :class:`Survey`, :class:`Binder`,
and the structural probes several ops' binders share.

A :class:`Binder` has two functions. ``find(path, module, survey)`` looks at one module (the
causal-LM head: any module holding ``lm_head`` and ``model``, so a wrapper's inner model too)
and returns the :class:`Place` s it offers, with the variant and the features the place needs
(read from the module's code and attributes, never from its weights or the model family's
name; a place that cannot take a kernel is returned with ``left`` saying why). ``bind(place,
kernel, edits)`` records what binding that place changes in :class:`Edits`; nothing is changed
until every place of the model has been bound, so a failure leaves the model as it was. Each
op's binder is ``veomni_ops/ops/<op>/binder.py`` (``BINDER``);
:data:`veomni_ops.binding.binders.BINDERS` gathers them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from torch import nn

from .functions import code_names, library_method
from .head import plain_linear

if TYPE_CHECKING:
    from ..plan import KernelPlan
    from ..target import Need

T = TypeVar("T")


@dataclass
class Place:
    """One spot in the model where an op's kernel goes.

    ``variant``: the variant the place needs, or a tuple of acceptable ones in order of
    preference. ``features``: what the kernel must honour there (``softcap``, ``sinks``, ...:
    see :data:`veomni_ops.spec.FEATURES`). ``foreign``: set when the method binding would
    replace is user code (a subclass's override): such a place is never replaced.
    """

    op: str
    variant: str | tuple[str, ...]
    path: str
    module: nn.Module
    info: dict[str, Any] = field(default_factory=dict)
    features: frozenset[str] = frozenset()
    foreign: str | None = None
    #: set when the module is the op's place but no kernel can go there (why): reported, not bound
    left: str | None = None


@dataclass
class Edits:
    """What binding will change, collected before anything is changed."""

    forwards: list[tuple[nn.Module, Callable]] = field(default_factory=list)
    #: per module (by id): the module and the globals its forward's copy gets
    globals: dict[int, tuple[nn.Module, dict[str, Any]]] = field(default_factory=dict)
    #: (module, transformers attention-mask name) for attention places
    mask_names: list[tuple[nn.Module, str]] = field(default_factory=list)
    #: per causal-LM head (by id of its module): "module", "ce" -> (variant, kernel), "lbl" -> kernel
    head: dict[int, dict[str, Any]] = field(default_factory=dict)

    #: per module (by id): why another op's kernel computes what it did (a fused kernel took over a
    #: norm the layer no longer calls); its own place is then not bound but listed as skipped. Set
    #: by the binder of a module that holds it: binding goes through places parent first
    taken: dict[int, str] = field(default_factory=dict)

    #: ``apply``'s ``skip_logits``, for the causal-LM head
    skip_logits: bool | None = None

    #: objects built once per binding and shared by its places (``shared``), and the forwards'
    #: copies by function and globals (``binding.functions.copy_with_globals``'s ``memo``)
    memo: dict[Hashable, Any] = field(default_factory=dict)

    def override_global(self, module: nn.Module, name: str, value: Any) -> None:
        self.globals.setdefault(id(module), (module, {}))[1][name] = value

    def shared(self, key: Hashable, build: Callable[[], T]) -> T:
        """``build()`` the first time ``key`` is asked for in this binding, then the same object.
        Places given the same kernel get the same override object, so their forwards' copies
        are one function (see ``copy_with_globals``)."""
        if key not in self.memo:
            self.memo[key] = build()
        return self.memo[key]


class Survey:
    """Facts about the whole model that binders read, each computed once per model
    (:meth:`fact`: the rotary dimension, a probe of the model's rotary function, ...)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._facts: dict[Hashable, Any] = {}

    def fact(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, computed the first time ``key`` is asked for in this model."""
        if key not in self._facts:
            self._facts[key] = compute()
        return self._facts[key]


@dataclass(frozen=True)
class Binder:
    """Where one op lives (``find``) and how its kernel goes in (``bind``).

    ``head``: a causal-LM head op (its places are listed after every other op's, as the
    head runs last). ``method``: what ``bind`` replaces on the place's module (checked for
    user overrides). ``order``: its place among the binders of one module (places are listed
    and bound in this order); ``None``: the op's (``OpDef.order``).

    The optional hooks (``needs``, ``lacks``, ``by_head``, ``finish``) hold what an op decides
    about the model as a whole (the eager attention a model was built with, the head's logits
    path): binding's own code asks the op's binder for them rather than naming the op.
    """

    op: str
    find: Callable[[str, nn.Module, Survey], list[Place]]
    bind: Callable[[Place, Callable, Edits], None]
    head: bool = False
    method: str = "forward"
    order: int | None = None
    #: ``needs(places, wanted)``: what resolution must provide for the op's ``places``, given what
    #: they need by their variants (``wanted``, a list of variants); ``None``: ``wanted`` as it is
    needs: Callable[[list[Place], list], list] | None = None
    #: ``lacks(plan)``: what a resolved plan given to ``apply`` lacks for the op's places (needs
    #: resolved beside it, without a lock); ``None``: nothing
    lacks: Callable[[KernelPlan], list[Need]] | None = None
    #: a head op whose kernel the causal-LM head another head op binds runs: where the plan
    #: leaves that op to the model, this one is left with it
    by_head: bool = False
    #: ``finish(edits, plan, places, notes)``: after every place is bound, what the op's places
    #: need built beyond their own edits (the causal-LM head's forward), and notes for the binding
    finish: Callable[[Edits, KernelPlan, list[Place], list[str]], None] | None = None


class NotBindable(ValueError):
    """A module looks like a place for an op but does not compute what the op's contract says."""


# ----------------------------------------------------------------------------------------
# Probes several ops' binders share
# ----------------------------------------------------------------------------------------


def is_silu(act: Any) -> bool:
    """Is ``act`` SiLU (the SwiGLU MLP's and the routed experts' activation)?"""
    return isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLU", "SiLUActivation")


def attention_forward_names(m: nn.Module) -> set[str]:
    """The names an ``*Attention`` module's (library) forward uses (empty for other modules):
    where attention and rotary find their places."""
    if not type(m).__name__.endswith("Attention"):
        return set()
    try:
        return code_names(library_method(type(m), "forward"))
    except AttributeError:  # not a Python function (a C extension, a callable object)
        return set()


#: Attributes a causal-LM forward reads to change the logits after lm_head (Gemma-2/3 soft-capping,
#: Cohere's logit_scale, Granite's logits_scaling). The core's head does not apply them.
_LOGIT_RESCALERS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def head_rescales_logits(model: nn.Module) -> bool:
    names = code_names(library_method(type(model), "forward"))
    cfg = getattr(model, "config", None)
    get_text = getattr(cfg, "get_text_config", None)
    text = get_text() if get_text is not None else cfg
    for n in _LOGIT_RESCALERS:
        if n in names:
            missing = object()
            value = next((v for v in (getattr(o, n, missing) for o in (model, text, cfg)) if v is not missing), None)
            if value is not None:  # Gemma-2 reads final_logit_softcapping but skips it when None
                return True
    return False


def head_parts(m: nn.Module) -> bool:
    """Does ``m`` hold a causal-LM head: an ``lm_head`` and an inner ``model`` (its own
    submodules, not attributes a wrapper forwards)? The head's ops (cross-entropy, the MoE
    aux loss) have their places there."""
    return "lm_head" in m._modules and isinstance(m._modules.get("model"), nn.Module)


def head_problem(m: nn.Module) -> str | None:
    """Why the core's causal-LM head cannot replace this one (``None``: it can): hidden states
    and the lm_head weight must be at hand, and nothing may change the logits between
    lm_head and the loss."""
    lm_head = m._modules["lm_head"]
    if not plain_linear(lm_head):
        return (f"lm_head is a {type(lm_head).__module__}.{type(lm_head).__qualname__}, not a plain nn.Linear "
                "(an adapter on the head, e.g. LoRA on lm_head): the fused loss would skip it")
    if head_rescales_logits(m):
        return "the model rescales its logits between lm_head and the loss (soft-capping or a logit scale)"
    return None

