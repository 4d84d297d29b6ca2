"""The causal-LM head bound by the ``cross_entropy`` binder.

Two paths, chosen per call:

* the **fused** path (a ``fused_linear`` kernel: the loss straight from the hidden states
  and the ``lm_head`` weight, logits never materialised; ``logits`` is ``None``) runs only
  where that is safe: the model is training, autograd is on, labels are given, a
  ``ModelOutput`` is asked for (not ``return_dict=False``, whose tuple positions would
  shift without the logits) and ``lm_head`` is still a plain ``nn.Linear`` (not an adapter
  added after binding);
* otherwise the **logits** path runs the model's own forward (a per-instance copy whose
  ``load_balancing_loss_func`` is the plan's kernel), so the output is exactly the unbound
  model's, and adds the loss computed from those logits by the plan's ``logits`` kernel.

``skip_logits=True|False`` (an ``apply`` argument, or a keyword of one call) forces one path.
The bound forward has the replaced forward's signature (``__signature__``, ``__wrapped__``).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..losses import causal_lm_loss_from_logits, causal_lm_loss_fused

#: Keyword arguments of the loss (transformers passes them to ``loss_function`` through ``**kwargs``).
_LOSS_KWARGS = ("num_items_in_batch", "ignore_index", "shift_labels")


def causal_lm_forward(original: Callable[..., Any], *, fused: Callable | None, logits: Callable,
                      lbl: Callable | None, skip_logits: bool | None = None,
                      owner: str = "model") -> Callable[..., Any]:
    """The bound causal-LM forward of one model instance.

    ``original``: the library forward (the function on the class, decorators included).
    ``fused``: the plan's ``fused_linear`` kernel, or ``None`` (the logits path always runs).
    ``logits``: the plan's ``logits`` kernel (the loss from logits). ``lbl``: the plan's
    ``load_balancing_loss`` kernel (MoE models), or ``None``. ``skip_logits``: the default of
    the per-call switch (``None``: decided per call, as above).
    """
    from .functions import copy_with_globals

    signature = inspect.signature(original)
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [n for n, p in signature.parameters.items() if p.kind in kinds][1:]  # after self
    model_forward = copy_with_globals(original, _aux_overrides(original, lbl)) if lbl is not None else original
    out_type = _output_type(signature, lbl is not None)
    out_fields = tuple(f.name for f in dataclasses.fields(out_type))  # here: dynamo cannot trace fields()

    def forward(self, *args, **kwargs):
        if args:
            _name_arguments(type(self).__name__, positional, args, kwargs)
        return_dict = kwargs.pop("return_dict", None)
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        skip = kwargs.pop("skip_logits", skip_logits)
        labels = kwargs.get("labels")
        want_loss = labels is not None or kwargs.get("shift_labels") is not None
        plain_head = plain_linear(self.lm_head)
        if skip is None:
            skip = (fused is not None and want_loss and bool(return_dict) and self.training
                    and torch.is_grad_enabled() and plain_head)
        elif skip:
            if not plain_head:
                raise ValueError(f"{owner}: skip_logits=True, but lm_head is now a {type(self.lm_head).__qualname__} "
                                 "(an adapter added after binding): the fused loss would skip it. Leave skip_logits "
                                 "unset (the logits path runs the adapter), or bind after adding the adapter.")
            if not want_loss:
                raise ValueError(f"{owner}: skip_logits=True needs labels (or shift_labels): without them there is "
                                 "no loss to compute instead of the logits")
            if fused is None:
                raise ValueError(f"{owner}: skip_logits=True needs a fused_linear cross-entropy kernel; the plan bound "
                                 "a logits kernel (name one that provides fused_linear, e.g. "
                                 "cross_entropy_loss_implementation: chunked)")
        out = _fused(self, kwargs, fused, lbl, out_type, out_fields) if skip else _with_logits(self, kwargs, model_forward, logits)
        return out if return_dict else out.to_tuple()

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    forward.__signature__ = signature  # type: ignore[attr-defined]
    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(forward, name, getattr(original, name, getattr(forward, name)))
    return forward


class _UnboundSlot:
    """Stands in for a VeOmni ``OpSlot`` in a copied forward: never takes its non-eager branch."""

    use_non_eager_impl = False


def _aux_overrides(original: Callable[..., Any], lbl: Callable) -> dict[str, Any]:
    """The globals that make the model's own forward compute the auxiliary loss with ``lbl``:
    transformers' ``load_balancing_loss_func``; in VeOmni's generated classes also its
    load-balancing slot, which would otherwise take VeOmni's kernel when one is bound."""
    from .functions import function_globals

    out: dict[str, Any] = {"load_balancing_loss_func": lbl}
    for name, value in function_globals(original).items():
        if "load_balancing" in name and hasattr(value, "use_non_eager_impl"):
            out[name] = _UnboundSlot()
    return out


def plain_linear(m: Any) -> bool:
    """Is ``m`` a plain ``nn.Linear`` (its forward is ``F.linear`` of its weight and bias)? An
    adapter put on ``lm_head`` after binding (PEFT's LoRA) is not: the fused loss would skip it."""
    return isinstance(m, torch.nn.Linear) and type(m).forward is torch.nn.Linear.forward


def _output_type(signature: inspect.Signature, moe: bool) -> type:
    from transformers.modeling_outputs import CausalLMOutputWithPast, MoeCausalLMOutputWithPast
    from transformers.utils import ModelOutput

    ann = signature.return_annotation
    if isinstance(ann, type) and issubclass(ann, ModelOutput) and dataclasses.is_dataclass(ann) \
            and "logits" in {f.name for f in dataclasses.fields(ann)}:
        return ann
    return MoeCausalLMOutputWithPast if moe else CausalLMOutputWithPast


def _with_logits(self, kwargs: dict[str, Any], model_forward: Callable, ce: Callable) -> Any:
    """The model's own forward without labels (so exactly its outputs), then the loss from its logits."""
    labels = kwargs.pop("labels", None)
    out = model_forward(self, **kwargs, return_dict=True)
    shift_labels = kwargs.get("shift_labels")
    if labels is None and shift_labels is None:
        return out
    loss = causal_lm_loss_from_logits(ce, out.logits, labels, ignore_index=kwargs.get("ignore_index", -100),
                                      num_items_in_batch=kwargs.get("num_items_in_batch"), shift_labels=shift_labels)
    aux = getattr(out, "aux_loss", None)
    if aux is not None:
        loss = loss + self.router_aux_loss_coef * aux.to(loss.device)
    return dataclasses.replace(out, loss=loss)


def _fused(self, kwargs: dict[str, Any], ce: Callable, lbl: Callable | None, out_type: type,
           fields: tuple[str, ...]) -> Any:
    """The base model, then the loss from its last hidden state and the ``lm_head`` weight."""
    labels = kwargs.pop("labels", None)
    kwargs.pop("logits_to_keep", None)  # no logits are made
    ignore_index = kwargs.get("ignore_index", -100)
    num_items_in_batch = kwargs.get("num_items_in_batch")
    shift_labels = kwargs.get("shift_labels")
    if lbl is not None and kwargs.get("output_router_logits") is None:
        kwargs["output_router_logits"] = getattr(self.config, "output_router_logits", False)
    for k in _LOSS_KWARGS:  # the base model takes no loss arguments
        kwargs.pop(k, None)
    outputs = self.model(**kwargs)
    loss = causal_lm_loss_fused(ce, outputs.last_hidden_state, self.lm_head.weight, labels, bias=self.lm_head.bias,
                                ignore_index=ignore_index, num_items_in_batch=num_items_in_batch,
                                shift_labels=shift_labels)
    values = {n: getattr(outputs, n) for n in fields if n not in ("loss", "logits", "aux_loss") and hasattr(outputs, n)}
    if lbl is not None and "aux_loss" in fields:
        aux = None
        if kwargs["output_router_logits"]:
            aux = lbl(outputs.router_logits, self.num_experts, self.num_experts_per_tok, kwargs.get("attention_mask"))
            loss = loss + self.router_aux_loss_coef * aux.to(loss.device)
        values["aux_loss"] = aux
    return out_type(loss=loss, logits=None, **values)


def _name_arguments(owner: str, positional: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Name positional ``args`` by the replaced forward's ``positional`` parameters, into ``kwargs``,
    refusing what Python would refuse."""
    if len(args) > len(positional):
        raise TypeError(f"{owner}.forward() takes {len(positional)} positional arguments but {len(args)} were given")
    for name, value in zip(positional, args):
        if name in kwargs:
            raise TypeError(f"{owner}.forward() got multiple values for argument {name!r}")
        kwargs[name] = value
