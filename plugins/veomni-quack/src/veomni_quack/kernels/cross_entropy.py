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

**Vocabulary padding (two Quack 0.6.5 limits, both seen on an H100).**

1. *Odd V with 16-bit logits does not compile.* Each thread copies ``gcd(V, 8)`` elements;
   an odd V gives 16-bit copies, which CuTe rejects ("'cp_size' only supports (32, 64, 128),
   but got 16").
2. *Some large V give NaN for every row.* For V above 16K (bf16/fp16; 64K for float32) the
   forward kernel splits each row over a cluster of CTAs, each warp reducing its own
   columns: ``max`` then ``sum(exp(x - max))``. Out-of-range columns are filled with -inf.
   When the tiling gives a warp no real column at all (``tile * cta + 32 * vec * warp >= V``;
   on sm 9.0 with bf16 this happens for V = 151936 and 152064, the Qwen vocabularies, and
   100352, but not 128256 or 262144), that warp computes ``exp(-inf - -inf) = NaN`` and the
   cluster reduction spreads it to every row's lse, loss and gradient.

For (1) the logits are padded (``F.pad``, differentiable: the gradient is a view of Quack's
padded gradient) to the next multiple of 8 with a large *finite* negative number (``-1e30``;
``-65504`` in float16), whose columns add ``exp(pad - lse) = 0`` to the sum and the gradient
(verified on an H100: V = 50257 in bf16 and fp16 passes ``veomni-ops check``). The cost is one
copy of the logits and a padded gradient.

For (2) the adapter **refuses** (``ValueError`` naming the vocabulary and the alternatives).
An earlier version padded these vocabularies to a width whose tiling has no empty warp
(151936 -> 155400); on the H100 the loss was still not finite (``veomni-ops check``,
2026-11-21), so the padding does not avoid the bug and is not offered. The tiling is
computed from Quack 0.6.5's source (``CrossEntropy._set_cluster_n``, ``_threads_per_row``,
``ReductionBase._get_tiled_copy``) and the GPU's compute capability; vocabularies it predicts
safe (32000, 50304, 128256, 262144, ...) pass on the H100.

Rows with a stride other than V (a slice of a wider buffer) are copied: Quack's backward
allocates a contiguous dX and its compiled kernel requires dX's row stride to equal X's
("Mismatched mdX.strides[0]", seen on the H100).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._common import (
    CHECKS,
    import_quack,
    layout_div,
    quack_labels,
    to_layout,
)

_quack_cross_entropy = import_quack("quack.cross_entropy").cross_entropy

_OP = "cross_entropy"


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor, *, ignore_index: int = -100) -> torch.Tensor:
    """``sum_i CE(logits_i, labels_i)`` over ``labels_i != ignore_index``, float32 scalar."""
    CHECKS.check_float(logits, "logits", _OP)
    CHECKS.check_ndim(logits, 2, "logits", _OP, "[N, V] (flatten leading dimensions with .view(-1, V))")
    n, vocab = logits.shape
    CHECKS.check_labels(labels, n, ignore_index)
    labels = quack_labels(labels, ignore_index, _OP)
    CHECKS.check_same_device(_OP, logits=logits, labels=labels)
    if vocab < 1:
        raise ValueError(f"{_OP} (quack): logits has an empty vocabulary dimension {tuple(logits.shape)}")
    if n == 0:
        # An empty sum, still connected to the graph so backward gives (empty) zeros.
        return logits.sum(dtype=torch.float32) * 0.0
    CHECKS.check_label_values(labels, vocab, ignore_index)
    bits = logits.element_size() * 8
    padded = padded_vocab(vocab, bits, arch_major(logits.device), logits.dtype)
    if padded != vocab:
        # F.pad writes a fresh contiguous tensor: no layout fix needed after it.
        x = F.pad(logits, (0, padded - vocab), value=_PAD_VALUE[logits.dtype])
    else:
        x = to_layout(logits, layout_div(vocab, logits))
        if x.stride(0) != vocab and n > 1:
            x = x.contiguous()  # dX is allocated contiguous and must match X's row stride
    return _quack_cross_entropy(x, labels, ignore_index=ignore_index, reduction="sum")


#: Finite pad logits (module docstring): exp(pad - lse) is 0 in float32, and pad * log2(e)
#: does not overflow float32 inside Quack's exp2.
_PAD_VALUE = {torch.float32: -1e30, torch.bfloat16: -1e30, torch.float16: -65504.0}

#: Compute capability major assumed for non-CUDA tensors (only the unit tests' stand-in gets
#: them: the device check refuses CPU tensors otherwise); sm 9.0 is the registered minimum.
STAND_IN_ARCH_MAJOR = 9


def arch_major(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0]
    return STAND_IN_ARCH_MAJOR


def forward_tiling(vocab: int, bits: int, major: int) -> tuple[int, int, int, int]:
    """``(cluster_n, threads_per_row, vecsize, tile_n)`` of Quack 0.6.5's CE forward kernel.

    Mirrors ``CrossEntropy._set_cluster_n`` / ``_threads_per_row`` (no ``_cap_cluster_n``
    there) and ``ReductionBase._get_tiled_copy``; forward only (no dx), so the widest dtype
    is the logits'.
    """
    if major < 9:
        cluster = 1
    else:
        max_cluster = 8 if major == 12 else 16
        if bits == 16 or (major == 12 and bits >= 32):
            limits = ((16 << 10, 1), (32 << 10, 2), (64 << 10, 4), (128 << 10, 8))
        else:
            limits = ((16 << 10, 1), (64 << 10, 2), (128 << 10, 4), (256 << 10, 8))
        cluster = next((c for limit, c in limits if vocab <= limit), max_cluster)
    tpr_limits = ((64, 8), (128, 16), (3072, 32), (6144, 64), (16384, 128))
    threads_per_row = next((t for limit, t in tpr_limits if vocab <= limit), 256)
    vec = math.gcd(vocab, 128 // bits)
    blocks = -(-(vocab // vec) // (threads_per_row * cluster))
    return cluster, threads_per_row, vec, vec * blocks * threads_per_row


def has_empty_warp(vocab: int, bits: int, major: int) -> bool:
    """True if some warp (thread group) of the forward launch gets no column ``< vocab``."""
    cluster, tpr, vec, tile = forward_tiling(vocab, bits, major)
    group = min(tpr, 32)
    # A group's first column is its lowest; the group is empty iff that is out of range.
    return any(c * tile + g * group * vec >= vocab for c in range(cluster) for g in range(tpr // group))


def padded_vocab(vocab: int, bits: int, major: int, dtype: torch.dtype | None = None) -> int:
    """``vocab`` if Quack handles it as is, the next multiple of 8 for odd 16-bit widths;
    raises ``ValueError`` where the forward tiling leaves a warp without columns (module
    docstring, limit 2)."""
    copies_ok = math.gcd(vocab, 128 // bits) * bits >= 32
    width = vocab if copies_ok else -(-vocab // 8) * 8
    if has_empty_warp(width, bits, major):
        what = str(dtype).removeprefix("torch.") if dtype is not None else f"{bits}-bit"
        raise ValueError(
            f"{_OP} (quack): vocabulary size V = {vocab} with {what} logits on sm {major}.x falls on a Quack 0.6.5 "
            "tiling that leaves a warp without columns, and its loss is not finite (seen on an H100 at V = 151936 "
            "and 100352; padding the vocabulary did not help). Choose another cross_entropy kernel for this model "
            "(cross_entropy: liger, or eager), or a vocabulary Quack tiles fully (e.g. padded to 262144)"
        )
    return width
