"""One binder per op: where the op lives in a transformers model, and how its kernel goes in.

A :class:`Binder` has two functions. ``find(path, module, survey)`` looks at one module (the
causal-LM head: any module holding ``lm_head`` and ``model``, so a wrapper's inner model too)
and returns the :class:`Place` s it offers, with the variant and the features the place needs
(read from the module's code and attributes, never from its weights or the model family's
name; a place that cannot take a kernel is returned with ``left`` saying why). ``bind(place, kernel, edits)`` records what binding that place changes in
:class:`Edits`; nothing is changed until every place of the model has been bound, so a
failure leaves the model as it was. A new model family or op is one entry in
:data:`BINDERS`, not another branch.

Places are found by structure: a one-input module with a ``[H]`` weight that computes
``w * x̂`` or ``x̂ * (1 + w)`` is an RMSNorm (probed), ``gate_proj``/``up_proj``/``down_proj``
around SiLU is a SwiGLU MLP, transformers v5's ``gate_up_proj [E, 2I, H]`` /
``down_proj [E, H, I]`` are routed experts, an ``*Attention`` module whose forward calls
``ALL_ATTENTION_FUNCTIONS`` / ``apply_rotary_pos_emb`` is attention / rotary.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from .functions import code_names, function_globals, library_method, user_override
from .head import plain_linear


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

    def override_global(self, module: nn.Module, name: str, value: Any) -> None:
        self.globals.setdefault(id(module), (module, {}))[1][name] = value


class Survey:
    """Facts about the whole model that several binders read (computed once)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.rot_dim = _rotary_dim(model)
        self._rotary_probes: dict[tuple[Any, int, int], bool] = {}

    def rotary_matches(self, fn: Callable, head_dim: int, rot_dim: int) -> bool:
        key = (fn, max(head_dim, rot_dim), rot_dim)
        if key not in self._rotary_probes:  # every layer shares the function: probe it once
            self._rotary_probes[key] = _rotary_matches_contract(*key)
        return self._rotary_probes[key]


@dataclass(frozen=True)
class Binder:
    """Where one op lives (``find``) and how its kernel goes in (``bind``).

    ``head``: a causal-LM head op (its places are listed after every other op's, as the
    head runs last). ``method``: what ``bind`` replaces on the place's module (checked for
    user overrides).
    """

    op: str
    find: Callable[[str, nn.Module, Survey], list[Place]]
    bind: Callable[[Place, Callable, Edits], None]
    head: bool = False
    method: str = "forward"


# ----------------------------------------------------------------------------------------
# rms_norm
# ----------------------------------------------------------------------------------------


def _probe_rms_variant(m: nn.Module, eps: float) -> str | None:
    """Which form the module computes, read from its code, not its data: its forward runs on
    the CPU in float64 with a random stand-in weight (``torch.func.functional_call``), so a
    module on the meta device (or with any weight values) is probed the same way."""
    w = cast(torch.Tensor, m.weight)
    h = w.shape[0]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, h, dtype=torch.float64, generator=g, device="cpu")
    wf = torch.rand(h, dtype=torch.float64, generator=g, device="cpu") + 0.5
    with torch.no_grad():
        try:
            out = torch.func.functional_call(m, {"weight": wf}, (x,), strict=False).double()
        except Exception:
            return None
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if torch.allclose(out, xhat * wf, rtol=1e-4, atol=1e-6):
        return "standard"
    if torch.allclose(out, xhat * (1.0 + wf), rtol=1e-4, atol=1e-6):
        return "offset"
    return None


class NotBindable(ValueError):
    """A module looks like a place for an op but does not compute what the op's contract says."""


def _find_rms_norm(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    cls = type(m).__name__
    weight = getattr(m, "weight", None)
    if not (cls.endswith("RMSNorm") and isinstance(weight, torch.Tensor) and weight.dim() == 1):
        return []
    eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
    if eps is None:
        return []
    if user_override(type(m), "forward"):  # never bound: what it computes does not matter
        return [Place("rms_norm", "standard", path, m, {"eps": float(eps)})]
    variant = _probe_rms_variant(m, float(eps))
    if variant is None:
        raise NotBindable(
            f"{path} ({cls}) looks like an RMSNorm but computes neither w*x̂ nor x̂*(1+w); "
            "veomni-ops cannot bind a kernel to it. Set rms_norm_implementation: eager."
        )
    return [Place("rms_norm", variant, path, m, {"eps": float(eps)})]


def _bind_rms_norm(place: Place, kernel: Callable, edits: Edits) -> None:
    eps = place.info["eps"]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return kernel(hidden_states, self.weight, eps)

    edits.forwards.append((place.module, forward))


# ----------------------------------------------------------------------------------------
# swiglu
# ----------------------------------------------------------------------------------------


def _is_silu(act: Any) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLU", "SiLUActivation")


def _find_swiglu(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    if all(isinstance(getattr(m, p, None), nn.Linear) for p in ("gate_proj", "up_proj", "down_proj")):
        if _is_silu(getattr(m, "act_fn", None)):
            return [Place("swiglu", "standard", path, m)]
    return []


def _bind_swiglu(place: Place, kernel: Callable, edits: Edits) -> None:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(kernel(self.gate_proj(x), self.up_proj(x)))
        # Seed-OSS applies dropout to the MLP output inside the MLP; keep it.
        p = getattr(self, "residual_dropout", 0.0)
        if p:
            out = nn.functional.dropout(out, p=p, training=self.training)
        return out

    edits.forwards.append((place.module, forward))


# ----------------------------------------------------------------------------------------
# moe_experts
# ----------------------------------------------------------------------------------------


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
        and _is_silu(getattr(m, "act_fn", None))
    )
    return [Place("moe_experts", "standard", path, m)] if ok else []


def _bind_experts(place: Place, kernel: Callable, edits: Edits) -> None:
    def forward(self, hidden_states, top_k_index, top_k_weights):
        return kernel(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj)

    edits.forwards.append((place.module, forward))


# ----------------------------------------------------------------------------------------
# attention and rotary (both inside an attention module's forward)
# ----------------------------------------------------------------------------------------


def _attention_forward_names(m: nn.Module) -> set[str]:
    if not type(m).__name__.endswith("Attention"):
        return set()
    try:
        return code_names(library_method(type(m), "forward"))
    except AttributeError:  # not a Python function (a C extension, a callable object)
        return set()


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
    if "ALL_ATTENTION_FUNCTIONS" not in _attention_forward_names(m):
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
    table = _FixedAttention(kernel, name, returns_weights=name == "eager")
    edits.override_global(place.module, "ALL_ATTENTION_FUNCTIONS", table)
    edits.mask_names.append((place.module, _mask_name(place.info["kernel_name"], kernel)))


def _rotary_dim(model: nn.Module) -> int | None:
    for name, m in model.named_modules():
        if name.endswith("rotary_emb") and hasattr(m, "inv_freq"):
            return int(m.inv_freq.shape[-1]) * 2
    return None


def _rotary_matches_contract(fn: Callable, head_dim: int, rot_dim: int) -> bool:
    """Is the model's ``apply_rotary_pos_emb`` the ``rotate_half`` form our contract has?"""
    from ..kernels.rotary import apply_rotary

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
    names = _attention_forward_names(m)
    if "apply_rotary_pos_emb" not in names or not survey.rot_dim:
        return []
    # A forward that can also take another rotary function (DeepSeek-V3's
    # apply_rotary_pos_emb_interleave when config.rope_interleave) would leave a kernel
    # bound to apply_rotary_pos_emb unused: bind only when the config rules that out.
    other_rope = any(n.startswith("apply_rotary") and n != "apply_rotary_pos_emb" for n in names)
    if other_rope and getattr(getattr(m, "config", None), "rope_interleave", None) is not False:
        return []
    fn = function_globals(library_method(type(m), "forward")).get("apply_rotary_pos_emb")
    head_dim = int(getattr(m, "qk_rope_head_dim", 0) or getattr(m, "head_dim", 0))
    if fn is None or not head_dim or not survey.rotary_matches(fn, head_dim, survey.rot_dim):
        return []
    variant = "partial" if survey.rot_dim < head_dim else "full"
    return [Place("rotary", variant, path, m, {"rot_dim": survey.rot_dim})]


def _bind_rotary(place: Place, kernel: Callable, edits: Edits) -> None:
    edits.override_global(place.module, "apply_rotary_pos_emb", kernel)


# ----------------------------------------------------------------------------------------
# cross_entropy and load_balancing_loss: the causal-LM head
# ----------------------------------------------------------------------------------------

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


def _head_parts(m: nn.Module) -> bool:
    """Does ``m`` hold a causal-LM head: an ``lm_head`` and an inner ``model`` (its own
    submodules, not attributes a wrapper forwards)?"""
    return "lm_head" in m._modules and isinstance(m._modules.get("model"), nn.Module)


def _head_problem(m: nn.Module) -> str | None:
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


def _find_head(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    if not _head_parts(m):
        return []
    return [Place("cross_entropy", ("fused_linear", "logits"), path, m, left=_head_problem(m))]


def _find_aux_loss(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    """The MoE aux loss, computed by the head (so only where the head is bound)."""
    if not _head_parts(m):
        return []
    try:
        fwd = library_method(type(m), "forward")
        names, globs = code_names(fwd), function_globals(fwd)
    except AttributeError:
        return []
    if "load_balancing_loss_func" in names and "load_balancing_loss_func" in globs:
        why = _head_problem(m)
        return [Place("load_balancing_loss", "standard", path, m,
                      left=f"computed by the causal-LM head, which is left: {why}" if why else None)]
    return []


def _bind_cross_entropy(place: Place, kernel: Callable, edits: Edits) -> None:
    edits.head.setdefault(id(place.module), {"module": place.module})["ce"] = (place.info["chosen_variant"], kernel)


def _bind_load_balancing(place: Place, kernel: Callable, edits: Edits) -> None:
    edits.head.setdefault(id(place.module), {"module": place.module})["lbl"] = kernel


#: Every op binding knows, in the order places are bound.
BINDERS: tuple[Binder, ...] = (
    Binder("rms_norm", _find_rms_norm, _bind_rms_norm),
    Binder("swiglu", _find_swiglu, _bind_swiglu),
    Binder("moe_experts", _find_experts, _bind_experts),
    Binder("attention", _find_attention, _bind_attention),
    Binder("rotary", _find_rotary, _bind_rotary),
    Binder("cross_entropy", _find_head, _bind_cross_entropy, head=True),
    Binder("load_balancing_loss", _find_aux_loss, _bind_load_balancing, head=True),
)
BY_OP: dict[str, Binder] = {b.op: b for b in BINDERS}


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
                places += [p for b in BINDERS if b.head is head for p in b.find(path, m, survey)]
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
