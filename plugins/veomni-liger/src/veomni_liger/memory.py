"""The fused linear cross-entropy adapter's chunk rule and what it allocates, without torch or Liger.

:func:`chunk_mem_const` is the ``chunk_mem_const`` the adapter
(:mod:`veomni_liger.kernels.cross_entropy`) passes Liger; :func:`fused_linear_extra` is its
spec's ``extra_memory`` (see :mod:`veomni_ops.ops.cross_entropy.memory` for the shapes and what
is counted). The spec module imports this one, so it stays light.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from veomni_ops.ops.cross_entropy.memory import fused_linear_shapes, returned_grads

#: Upper bound on one chunk's logits (input dtype) in the fused-linear kernel; see the adapter's
#: module docstring. 1 GiB keeps the peak a small fraction of the eager path's [N, V] tensors.
CHUNK_LOGITS_BUDGET_BYTES = 2**30


def liger_chunk_tokens(n: int, hdim: int, vocab: int, chunk_mem_const: int) -> int:
    """Tokens per chunk Liger 0.8.5 takes for ``chunk_mem_const``: ``inc = cdiv(V, c·H)``,
    ``chunk = min(next_pow2(cdiv(N, inc)), N)``."""
    inc = -(-vocab // (chunk_mem_const * hdim))
    tokens = -(-n // inc)
    return min(1 << (tokens - 1).bit_length(), n)


@functools.lru_cache(maxsize=256)
def chunk_mem_const(n: int, hdim: int, vocab: int, itemsize: int, budget: int) -> int:
    """The largest ``chunk_mem_const`` (1..256) whose chunk logits fit ``budget`` bytes; 1
    (Liger's default, its smallest chunks) when even that exceeds the budget."""
    best = 1
    for c in range(2, 257):
        tokens = liger_chunk_tokens(n, hdim, vocab, c)
        if tokens * vocab * itemsize > budget:
            break
        best = c
        if tokens >= n:
            break
    return best


def fused_linear_extra(shapes: Mapping[str, int]) -> int:
    """Bytes beyond the inputs and returned gradients of one training call (all in Liger's
    forward; backward scales in place): the per-token losses (float32), ``dH``, the ``dW``
    accumulator (float32 for bf16/fp16 weights, else the weight's dtype) and one chunk's logits
    buffer; at the end the accumulator is cast to the weight's dtype while still held."""
    n, h, v, s, _ = fused_linear_shapes(shapes)
    c = liger_chunk_tokens(n, h, v, chunk_mem_const(n, h, v, s, CHUNK_LOGITS_BUDGET_BYTES))
    acc = 4 if s < 4 else s
    chunks = 4 * n + n * h * s + acc * v * h + c * v * s
    end = 4 * n + n * h * s + acc * v * h + (v * h * s if acc != s else 0)
    return max(0, max(chunks, end) - returned_grads(n, h, v, s))
