"""Bind a :class:`KernelPlan` into one transformers model instance.

Everything is per instance: a module's ``forward`` is replaced by an instance attribute
that calls the plan's kernel directly (no lookup per call), and the few model functions
that call module-level helpers (``apply_rotary_pos_emb``, the attention interface table,
``load_balancing_loss_func``) run as per-instance copies whose globals name the plan's
kernels. Nothing module-level is mutated, so two models in one process can carry
different plans, and ``torch.compile(fullgraph=True)`` traces straight through.

What each module needs is read from the model: the RMSNorm variant by probing the
module (``w * x̂`` vs ``x̂ * (1 + w)``), the rotary variant from the rotary dimension the
model's rotary embedding produces vs the attention head dimension.
"""

from __future__ import annotations

import copy
import inspect
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .config import AUTO, OP_TO_FIELD, OpsConfig
from .device import DeviceInfo, current_device
from .losses import causal_lm_loss_from_logits, causal_lm_loss_fused
from .plan import KernelPlan
from .resolve import resolve


class BindingError(ValueError):
    """The plan and the model do not fit together."""


@dataclass
class Place:
    """One spot in the model where an op's kernel goes."""

    op: str
    variant: str | tuple[str, ...]
    path: str
    module: nn.Module
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Binding:
    """What ``apply`` did: the plan, and per module path the op, variant and kernel bound."""

    plan: KernelPlan
    bound: tuple[tuple[str, str, str, str], ...]

    def summary(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, op, _, _ in self.bound:
            out[op] = out.get(op, 0) + 1
        return out


# ----------------------------------------------------------------------------------------
# Survey: where does each op live in this model?
# ----------------------------------------------------------------------------------------


def _forward_fn(module: nn.Module):
    return type(module).forward


def _code_names(fn) -> set[str]:
    return set(inspect.unwrap(fn).__code__.co_names)


def _globals(fn) -> dict[str, Any]:
    return inspect.unwrap(fn).__globals__


def _probe_rms_variant(m: nn.Module, eps: float) -> str | None:
    w = m.weight
    h = w.shape[0]
    with torch.no_grad():
        x = torch.randn(3, h, dtype=torch.float32, device=w.device, generator=torch.Generator(w.device).manual_seed(0))
        try:
            out = m(x.to(w.dtype)).float()
        except Exception:
            return None
        xf = x.to(w.dtype).float()
        xhat = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        wf = w.float()
        tol = dict(rtol=2e-2, atol=2e-2) if w.dtype in (torch.bfloat16, torch.float16) else dict(rtol=1e-4, atol=1e-5)
        if torch.allclose(out, xhat * wf, **tol):
            return "standard"
        if torch.allclose(out, xhat * (1.0 + wf), **tol):
            return "offset"
    return None


def _is_silu(act: Any) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLU", "SiLUActivation")


def _rotary_dim(model: nn.Module) -> int | None:
    for name, m in model.named_modules():
        if name.endswith("rotary_emb") and hasattr(m, "inv_freq"):
            return int(m.inv_freq.shape[-1]) * 2
    return None


def _rotary_matches_contract(fn: Callable, head_dim: int, rot_dim: int) -> bool:
    """Is the model's ``apply_rotary_pos_emb`` the ``rotate_half`` form our contract has?"""
    from .kernels.rotary import apply_rotary

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 3, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 3, head_dim, generator=g, dtype=torch.float64)
    ang = torch.randn(1, 3, rot_dim // 2, generator=g, dtype=torch.float64)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    try:
        got = fn(q, k, cos, sin)
        want = apply_rotary(q, k, cos, sin)
    except Exception:
        return False
    return all(torch.allclose(a, b) for a, b in zip(got, want))


#: Attributes a causal-LM forward reads to change the logits after lm_head (Gemma-2/3 soft-capping,
#: Cohere's logit_scale, Granite's logits_scaling). The core's head does not apply them.
_LOGIT_RESCALERS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _head_rescales_logits(model: nn.Module) -> bool:
    names = _code_names(_forward_fn(model))
    cfg = getattr(model, "config", None)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for n in _LOGIT_RESCALERS:
        if n in names:
            missing = object()
            value = next((v for v in (getattr(o, n, missing) for o in (model, text, cfg)) if v is not missing), None)
            if value is not None:  # Gemma-2 reads final_logit_softcapping but skips it when None
                return True
    return False


def survey(model: nn.Module) -> list[Place]:
    """Every place in ``model`` where an op's kernel can be bound, with the variant it needs."""
    places: list[Place] = []
    rot_dim = _rotary_dim(model)
    rotary_probes: dict[tuple[Any, int, int], bool] = {}
    for path, m in model.named_modules():
        cls = type(m).__name__
        # RMSNorm: a one-input module with a [H] weight whose output is w*x̂ or x̂*(1+w).
        if cls.endswith("RMSNorm") and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 1:
            eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
            if eps is not None:
                variant = _probe_rms_variant(m, float(eps))
                if variant is None:
                    raise BindingError(
                        f"{path} ({cls}) looks like an RMSNorm but computes neither w*x̂ nor x̂*(1+w); "
                        "veomni-ops cannot bind a kernel to it. Set rms_norm_implementation: eager."
                    )
                places.append(Place("rms_norm", variant, path, m, {"eps": float(eps)}))
        # SwiGLU MLP: gate/up/down linear projections around SiLU.
        elif all(isinstance(getattr(m, p, None), nn.Linear) for p in ("gate_proj", "up_proj", "down_proj")):
            if _is_silu(getattr(m, "act_fn", None)):
                places.append(Place("swiglu", "standard", path, m))
        # Routed experts, transformers v5 layout.
        elif isinstance(getattr(m, "gate_up_proj", None), nn.Parameter) and m.gate_up_proj.dim() == 3:
            gu, dn = m.gate_up_proj, getattr(m, "down_proj", None)
            ok = (
                isinstance(dn, nn.Parameter) and dn.dim() == 3 and gu.shape[0] == dn.shape[0]
                and gu.shape[1] == 2 * dn.shape[2] and gu.shape[2] == dn.shape[1]
                and not getattr(m, "has_bias", False) and not getattr(m, "is_transposed", False)
                and _is_silu(getattr(m, "act_fn", None))
            )
            if ok:
                places.append(Place("moe_experts", "standard", path, m))
        # Attention modules that dispatch through the attention interface / apply_rotary_pos_emb.
        if cls.endswith("Attention") and hasattr(m, "forward"):
            names = _code_names(_forward_fn(m))
            if "ALL_ATTENTION_FUNCTIONS" in names:
                places.append(Place("attention", "standard", path, m))
            # A forward that can also take another rotary function (DeepSeek-V3's
            # apply_rotary_pos_emb_interleave when config.rope_interleave) would leave a kernel
            # bound to apply_rotary_pos_emb unused: bind only when the config rules that out.
            other_rope = any(n.startswith("apply_rotary") and n != "apply_rotary_pos_emb" for n in names)
            if other_rope and getattr(getattr(m, "config", None), "rope_interleave", None) is not False:
                pass
            elif "apply_rotary_pos_emb" in names and rot_dim:
                glob = _globals(_forward_fn(m))
                fn = glob.get("apply_rotary_pos_emb")
                head_dim = int(getattr(m, "qk_rope_head_dim", 0) or getattr(m, "head_dim", 0))
                probe = (fn, max(head_dim, rot_dim), rot_dim)
                if fn is not None and head_dim and probe not in rotary_probes:
                    # Every layer shares the function: probe it once per survey.
                    rotary_probes[probe] = _rotary_matches_contract(*probe)
                if fn is not None and head_dim and rotary_probes[probe]:
                    variant = "partial" if rot_dim < head_dim else "full"
                    places.append(Place("rotary", variant, path, m, {"rot_dim": rot_dim}))
    # The causal-LM head: hidden states + lm_head weight are available here, unless the
    # model's head changes the logits between lm_head and the loss (which ours would drop).
    lm_head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    if isinstance(lm_head, nn.Linear) and isinstance(inner, nn.Module) and not _head_rescales_logits(model):
        places.append(Place("cross_entropy", ("fused_linear", "logits"), "", model))
        glob = _globals(_forward_fn(model))
        if "load_balancing_loss_func" in _code_names(_forward_fn(model)) and "load_balancing_loss_func" in glob:
            places.append(Place("load_balancing_loss", "standard", "", model))
    return places


# ----------------------------------------------------------------------------------------
# Apply
# ----------------------------------------------------------------------------------------


def _model_dtype(model: nn.Module) -> str | None:
    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return None


def _needs(places: list[Place]) -> dict[str, list]:
    needs: dict[str, list] = {}
    for p in places:
        lst = needs.setdefault(p.op, [])
        if p.variant not in lst:
            lst.append(p.variant)
    return needs


def apply(
    model: nn.Module,
    config_or_plan: KernelPlan | OpsConfig | Mapping[str, Any] | str | None = None,
    *,
    device: DeviceInfo | str | None = None,
    registry=None,
    training: bool = True,
) -> Binding:
    """Resolve (if given a config) and bind kernels into ``model``. Returns a :class:`Binding`.

    An explicit non-eager kernel for an op the model has no place for raises
    :class:`BindingError`; with ``auto`` such ops are simply not bound.
    """
    places = survey(model)
    have_ops = {p.op for p in places}
    if isinstance(config_or_plan, KernelPlan):
        plan = config_or_plan
        cfg = plan.config
    else:
        cfg = config_or_plan if isinstance(config_or_plan, OpsConfig) else None
        if cfg is None:
            from .resolve import _as_config

            cfg = _as_config(config_or_plan)
    if cfg.for_op("cross_entropy") == "eager":
        # The reference means "what transformers does": logits, then the loss (and the
        # logits are returned). Other kernels prefer the fused form, which never holds them.
        for p in places:
            if p.op == "cross_entropy":
                p.variant = ("logits", "fused_linear")
    unplaced = [
        f"{OP_TO_FIELD[op]}={cfg.for_op(op)!r}"
        for op in OP_TO_FIELD
        if cfg.for_op(op) not in (AUTO, "eager") and op not in have_ops
    ]
    if unplaced:
        raise BindingError(
            f"{type(model).__name__} has no place for: {', '.join(unplaced)}. The model has no module for that op "
            "(or not in a form veomni-ops can bind); set the field to 'auto' or 'eager'."
        )
    if not isinstance(config_or_plan, KernelPlan):
        plan = resolve(cfg, current_device(device), needs=_needs(places), registry=registry,
                       dtype=_model_dtype(model), training=training)
    bound = _bind(model, plan, places)
    model.veomni_ops_binding = bound  # per instance, for inspection
    return bound


def _pick(plan: KernelPlan, op: str, variant) -> tuple[str, Callable]:
    alts = (variant,) if isinstance(variant, str) else variant
    for v in alts:
        e = plan.get(op, v)
        if e is not None:
            return v, plan.kernel(op, v)
    raise BindingError(
        f"the plan has no kernel for {op}/{' or '.join(alts)}, which the model needs; resolve the plan with "
        f"this model's needs (veomni_ops.apply(model, config) does that)"
    )


def _copy_with_globals(fn, overrides: Mapping[str, Any]):
    """A copy of ``fn`` whose module globals are overridden: per-instance, nothing shared.

    A decorated function (``functools.wraps``: ``fn.__wrapped__`` is the function it wraps)
    is copied layer by layer: the innermost function gets the new globals, and each wrapper
    is copied with the closure cell that held the function below it pointing at the copy.
    The decorators' own code (transformers' ``deprecate_kwarg``, say) still runs.
    """
    inner = getattr(fn, "__wrapped__", None)
    if inner is None:
        return _copy_plain(fn, overrides)
    cells = fn.__closure__ or ()
    held = [i for i, c in enumerate(cells) if _cell_contents(c) is inner]
    if len(held) != 1:
        raise BindingError(
            f"{fn.__module__}.{fn.__qualname__} is wrapped by a decorator that does not keep the wrapped function "
            "in its closure; veomni-ops cannot redirect the globals it calls"
        )
    new_inner = _copy_with_globals(inner, overrides)
    new_cells = tuple(types.CellType(new_inner) if i == held[0] else c for i, c in enumerate(cells))
    new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, new_cells)
    new.__dict__.update(fn.__dict__)
    new.__wrapped__ = new_inner
    _copy_names(fn, new)
    return new


_EMPTY = object()


def _cell_contents(cell) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _EMPTY


def _copy_names(src, dst) -> None:
    dst.__module__ = src.__module__
    dst.__kwdefaults__ = src.__kwdefaults__
    dst.__qualname__ = src.__qualname__
    dst.__doc__ = src.__doc__


def _copy_plain(fn, overrides: Mapping[str, Any]):
    g = dict(fn.__globals__)
    g.update(overrides)
    # No ``__name__``: torch._dynamo resolves the globals of a function whose globals carry a
    # module name through that module (``sys.modules[__name__]``), which would read and guard
    # transformers' own ALL_ATTENTION_FUNCTIONS instead of ours; without it dynamo guards this
    # dict itself.
    g.pop("__name__", None)
    new = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    _copy_names(fn, new)
    return new


class _FixedAttention:
    """Stands in for transformers' attention table inside one model: always our kernel."""

    def __init__(self, kernel: Callable):
        self.kernel = kernel

    def get_interface(self, name, default=None):
        return self.kernel

    def __getitem__(self, name):
        return self.kernel

    def get(self, name, default=None):
        return self.kernel


def _mask_name(entry_kernel: str, kernel: Callable) -> str:
    """Which transformers mask builder feeds this kernel (set as config._attn_implementation)."""
    kind = getattr(kernel, "veomni_mask", None)
    if kind:
        return kind
    return "eager" if entry_kernel == "eager" else "sdpa"


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
            mod.config = copy.deepcopy(c, memo)


def _bind(model: nn.Module, plan: KernelPlan, places: list[Place]) -> Binding:
    # Everything is picked and built before the model is touched: a plan that lacks a kernel,
    # or a forward that cannot be rebound, leaves the model as it was, not half bound.
    picks = [(p, *_pick(plan, p.op, p.variant)) for p in places]
    bound: list[tuple[str, str, str, str]] = []
    forwards: list[tuple[nn.Module, Callable]] = []
    attn_overrides: dict[int, dict[str, Any]] = {}
    attn_modules: dict[int, Place] = {}
    mask_names: list[tuple[nn.Module, str]] = []
    head_overrides: dict[str, Any] = {}
    for p, variant, kernel in picks:
        name = plan.get(p.op, variant).kernel
        m = p.module
        if p.op == "rms_norm":
            forwards.append((m, _norm_forward(kernel, p.info["eps"])))
        elif p.op == "swiglu":
            forwards.append((m, _mlp_forward(kernel)))
        elif p.op == "moe_experts":
            forwards.append((m, _experts_forward(kernel)))
        elif p.op == "rotary":
            attn_overrides.setdefault(id(m), {})["apply_rotary_pos_emb"] = kernel
            attn_modules[id(m)] = p
        elif p.op == "attention":
            attn_overrides.setdefault(id(m), {})["ALL_ATTENTION_FUNCTIONS"] = _FixedAttention(kernel)
            attn_modules[id(m)] = p
            mask_names.append((m, _mask_name(name, kernel)))
        elif p.op == "cross_entropy":
            head_overrides["ce"] = (variant, kernel)
        elif p.op == "load_balancing_loss":
            head_overrides["lbl"] = kernel
        bound.append((p.path, p.op, variant, name))
    for key, overrides in attn_overrides.items():
        m = attn_modules[key].module
        forwards.append((m, _copy_with_globals(_forward_fn(m), overrides)))
    if "ce" in head_overrides:
        sig = inspect.signature(_forward_fn(model))
        forwards.append((model, _causal_lm_forward(head_overrides["ce"], head_overrides.get("lbl"), sig)))

    # Now change the model.
    if mask_names:
        _own_configs(model)
    for m, mask in mask_names:
        cfg = getattr(model, "config", None)
        sub = getattr(m, "config", None)
        for c in {id(x): x for x in (cfg, sub) if x is not None}.values():
            c._attn_implementation = mask
    for m, fn in forwards:
        m.forward = types.MethodType(fn, m)
    return Binding(plan, tuple(bound))


def _norm_forward(kernel: Callable, eps: float):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return kernel(hidden_states, self.weight, eps)

    return forward


def _mlp_forward(kernel: Callable):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(kernel(self.gate_proj(x), self.up_proj(x)))
        # Seed-OSS applies dropout to the MLP output inside the MLP; keep it.
        p = getattr(self, "residual_dropout", 0.0)
        if p:
            out = nn.functional.dropout(out, p=p, training=self.training)
        return out

    return forward


def _experts_forward(kernel: Callable):
    def forward(self, hidden_states, top_k_index, top_k_weights):
        return kernel(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj)

    return forward


def _causal_lm_forward(ce: tuple[str, Callable], lbl: Callable | None, signature: inspect.Signature):
    """The causal-LM head: the base model, then the loss through the plan's kernels.

    With a ``fused_linear`` kernel and labels, the logits are never materialised (the
    returned ``logits`` is None). The auxiliary MoE loss follows transformers: computed
    when router logits are requested, added to the loss times ``router_aux_loss_coef``.
    Calling conventions are the replaced forward's: positional arguments are named by its
    ``signature``, and ``return_dict=False`` (or ``config.return_dict``) gives a tuple.
    """
    from transformers.modeling_outputs import CausalLMOutputWithPast, MoeCausalLMOutputWithPast

    variant, ce_kernel = ce
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [n for n, p in signature.parameters.items() if p.kind in kinds][1:]  # after self

    def forward(self, *args, **kwargs):
        if args:
            if len(args) > len(positional):
                raise TypeError(f"{type(self).__name__}.forward() takes {len(positional)} positional arguments "
                                f"but {len(args)} were given")
            for name, value in zip(positional, args):
                if name in kwargs:
                    raise TypeError(f"{type(self).__name__}.forward() got multiple values for argument {name!r}")
                kwargs[name] = value
        return_dict = kwargs.pop("return_dict", None)
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        out = head(self, **kwargs)
        return out if return_dict else out.to_tuple()

    def head(self, input_ids=None, attention_mask=None, labels=None, logits_to_keep=0,
             output_router_logits=None, **kwargs):
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        ignore_index = kwargs.pop("ignore_index", -100)
        shift_labels = kwargs.pop("shift_labels", None)
        if lbl is not None:
            if output_router_logits is None:
                output_router_logits = getattr(self.config, "output_router_logits", False)
            kwargs["output_router_logits"] = output_router_logits
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        hidden = outputs.last_hidden_state
        loss = logits = None
        want_loss = labels is not None or shift_labels is not None
        if want_loss and variant == "fused_linear":
            loss = causal_lm_loss_fused(ce_kernel, hidden, self.lm_head.weight, labels, bias=self.lm_head.bias,
                                        ignore_index=ignore_index, num_items_in_batch=num_items_in_batch,
                                        shift_labels=shift_labels)
        else:
            sl = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
            logits = self.lm_head(hidden[:, sl, :])
            if want_loss:
                loss = causal_lm_loss_from_logits(ce_kernel, logits, labels, ignore_index=ignore_index,
                                                  num_items_in_batch=num_items_in_batch, shift_labels=shift_labels)
        if lbl is None:
            return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=outputs.past_key_values,
                                          hidden_states=outputs.hidden_states, attentions=outputs.attentions)
        aux_loss = None
        if output_router_logits:
            aux_loss = lbl(outputs.router_logits, self.num_experts, self.num_experts_per_tok, attention_mask)
            if loss is not None:
                loss = loss + self.router_aux_loss_coef * aux_loss.to(loss.device)
        return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux_loss, logits=logits,
                                         past_key_values=outputs.past_key_values, hidden_states=outputs.hidden_states,
                                         attentions=outputs.attentions, router_logits=outputs.router_logits)

    return forward
