"""``cross_entropy`` / ``logits`` through ``quack.cross_entropy.cross_entropy``.

Quack 0.6.5's ``cross_entropy(x, target, lse_partial=None, weight=None, ignore_index=-100,
reduction="mean", inplace_backward=False)`` runs ``CrossEntropyFunction``: the forward
kernel reads ``x [M, V]`` (fp32/bf16/fp16) once, computes the log-sum-exp in float32 and
writes a **float32** per-row loss (0 where ``target == ignore_index``) and the float32 lse;
the backward kernel recomputes ``softmax - one_hot`` from x and the lse, zero for ignored
rows, in x's dtype. ``reduction="sum"`` is ``loss.sum()`` of the float32 per-row losses:
exactly the contract's float32 sum over the counted tokens (``"mean"`` would divide by the
count, which the core does itself).

``inplace_backward`` stays False: with True Quack writes dX into the logits' storage.
Labels outside ``[0, V)`` other than ``ignore_index`` make Quack's kernel read out of
bounds; they are refused here (one host synchronisation per call).
"""

from __future__ import annotations

import torch

from ._common import (
    check_device,
    check_float,
    check_label_range,
    check_labels,
    import_quack,
    layout_div,
    to_layout,
)

_quack_cross_entropy = import_quack("quack.cross_entropy").cross_entropy

_OP = "cross_entropy"


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor, *, ignore_index: int = -100) -> torch.Tensor:
    """``sum_i CE(logits_i, labels_i)`` over ``labels_i != ignore_index``, float32 scalar."""
    check_float(logits, "logits", _OP)
    if logits.dim() != 2:
        raise ValueError(
            f"{_OP} (quack): logits must be 2-D [N, V] (flatten leading dimensions with .view(-1, V)), "
            f"got {tuple(logits.shape)}"
        )
    n, vocab = logits.shape
    labels = check_labels(labels, n, ignore_index, _OP)
    check_device(_OP, logits=logits, labels=labels)
    if vocab < 1:
        raise ValueError(f"{_OP} (quack): logits has an empty vocabulary dimension {tuple(logits.shape)}")
    if n == 0:
        # An empty sum, still connected to the graph so backward gives (empty) zeros.
        return logits.sum(dtype=torch.float32) * 0.0
    check_label_range(labels, vocab, ignore_index, _OP)
    x = to_layout(logits, layout_div(vocab, logits))
    return _quack_cross_entropy(x, labels, ignore_index=ignore_index, reduction="sum")
