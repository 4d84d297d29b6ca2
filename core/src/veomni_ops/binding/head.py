"""The causal-LM head bound by the ``cross_entropy`` binder: the base model, then the loss
through the plan's kernels (and the MoE auxiliary loss through ``load_balancing_loss``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..losses import causal_lm_loss_from_logits, causal_lm_loss_fused


def causal_lm_forward(ce: tuple[str, Callable], lbl: Callable | None,
                      signature: inspect.Signature) -> Callable[..., Any]:
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
            _name_arguments(type(self).__name__, positional, args, kwargs)
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
        loss, logits = _loss_and_logits(self.lm_head, variant, ce_kernel, outputs.last_hidden_state, labels,
                                        shift_labels, logits_to_keep, ignore_index, num_items_in_batch)
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


def _name_arguments(owner: str, positional: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Name positional ``args`` by the replaced forward's ``positional`` parameters, into ``kwargs``,
    refusing what Python would refuse."""
    if len(args) > len(positional):
        raise TypeError(f"{owner}.forward() takes {len(positional)} positional arguments but {len(args)} were given")
    for name, value in zip(positional, args):
        if name in kwargs:
            raise TypeError(f"{owner}.forward() got multiple values for argument {name!r}")
        kwargs[name] = value


def _loss_and_logits(lm_head: Any, variant: str, ce_kernel: Callable, hidden: Any, labels: Any, shift_labels: Any,
                     logits_to_keep: Any, ignore_index: int, num_items_in_batch: Any) -> tuple[Any, Any]:
    """``(loss, logits)``: with a ``fused_linear`` kernel and labels, the loss from the hidden states and
    no logits; else the logits of the kept positions, and the loss from them where there are labels."""
    want_loss = labels is not None or shift_labels is not None
    if want_loss and variant == "fused_linear":
        loss = causal_lm_loss_fused(ce_kernel, hidden, lm_head.weight, labels, bias=lm_head.bias,
                                    ignore_index=ignore_index, num_items_in_batch=num_items_in_batch,
                                    shift_labels=shift_labels)
        return loss, None
    sl = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    logits = lm_head(hidden[:, sl, :])
    if not want_loss:
        return None, logits
    return causal_lm_loss_from_logits(ce_kernel, logits, labels, ignore_index=ignore_index,
                                      num_items_in_batch=num_items_in_batch, shift_labels=shift_labels), logits
