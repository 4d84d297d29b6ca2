"""Causal-LM loss semantics around a token-level cross-entropy kernel.

The kernel returns a float32 **sum** over counted tokens (see the ``cross_entropy`` hook
contract); this module does what transformers' ``ForCausalLMLoss`` does around it: the
label shift, then the division by the number of counted tokens, or by
``num_items_in_batch`` under gradient accumulation.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def shifted_labels(labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """``labels[..., 1:]`` padded with ``ignore_index``: tokens < n predict n."""
    return F.pad(labels, (0, 1), value=ignore_index)[..., 1:].contiguous()


def _shift(labels: torch.Tensor | None, shift_labels: torch.Tensor | None, ignore_index: int) -> torch.Tensor:
    """The flat shifted labels: ``shift_labels`` as given, else shifted from ``labels``."""
    if shift_labels is None:
        if labels is None:
            raise ValueError("the causal-LM loss needs labels or shift_labels")
        shift_labels = shifted_labels(labels, ignore_index)
    return shift_labels.reshape(-1)


def normalise(total: torch.Tensor, shift: torch.Tensor, ignore_index: int,
              num_items_in_batch: torch.Tensor | int | None) -> torch.Tensor:
    """The loss from a kernel's sum ``total`` over the flat shifted labels ``shift``: divided by
    ``num_items_in_batch`` where given, else by the number of counted tokens, as transformers'
    ``ForCausalLMLoss`` does.

    With no counted token (every label ``ignore_index``: a batch of prompt-only rows) the value
    is transformers': ``0 / 0 = nan`` (or 0 over a positive ``num_items_in_batch``). So are the
    gradients: zero. transformers gets zero because ``F.cross_entropy``'s backward writes only
    the counted rows, whatever the incoming gradient, here ``1 / 0 = inf``; a kernel that stores
    its gradients in the forward and scales them in backward (``chunked``, Liger's, Quack's,
    veomni-triton's) would compute ``0 * inf = nan`` in every one. So the empty sum passes no
    gradient back: it is a constant 0 then, with a zero gradient whatever divides it. A select,
    not a branch: no host synchronisation, and nothing for ``torch.compile`` to break on.
    """
    counted = (shift != ignore_index).sum()
    total = torch.where(counted > 0, total, total.detach())
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch
    # Same as F.cross_entropy(reduction="mean"): 0/0 = nan when every label is ignored.
    return total / counted


def causal_lm_loss_from_logits(
    kernel: Callable[..., torch.Tensor],
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    ignore_index: int = -100,
    num_items_in_batch: torch.Tensor | int | None = None,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    shift = _shift(labels, shift_labels, ignore_index).to(logits.device)
    total = kernel(logits.reshape(-1, logits.shape[-1]), shift, ignore_index=ignore_index)
    return normalise(total, shift, ignore_index, num_items_in_batch)


def causal_lm_loss_fused(
    kernel: Callable[..., torch.Tensor],
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    num_items_in_batch: torch.Tensor | int | None = None,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    shift = _shift(labels, shift_labels, ignore_index).to(hidden_states.device)
    device = hidden_states.device.type
    if torch.is_autocast_enabled(device):
        # What autocast does to the lm_head it replaces: the logits GEMM in the autocast dtype
        # (the casts are autograd ops, so float32 master weights get their gradient). The kernel
        # itself runs outside autocast, which would recast its own GEMMs and out= buffers.
        dt = torch.get_autocast_dtype(device)
        hidden_states, weight = hidden_states.to(dt), weight.to(dt)
        bias = bias.to(dt) if bias is not None else None
        with torch.autocast(device, enabled=False):
            total = kernel(hidden_states.reshape(-1, hidden_states.shape[-1]), weight, shift, bias=bias,
                           ignore_index=ignore_index)
    else:
        total = kernel(hidden_states.reshape(-1, hidden_states.shape[-1]), weight, shift, bias=bias,
                       ignore_index=ignore_index)
    return normalise(total, shift, ignore_index, num_items_in_batch)
