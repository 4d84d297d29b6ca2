"""The fused linear cross-entropy's chunk rule and what it allocates, without torch or Triton.

:func:`chunk_tokens` is the rule the kernel (:mod:`veomni_triton.kernels.cross_entropy`) uses;
:func:`fused_linear_extra` is its spec's ``extra_memory`` (see
:mod:`veomni_ops.ops.cross_entropy.memory` for the shapes and what is counted). The spec module
imports this one, so it stays light.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from veomni_ops.ops.cross_entropy.memory import fused_linear_shapes, returned_grads

#: Budget for one chunk's logits in the input dtype: 2.5 GiB holds 8,832 tokens of a 151,936
#: vocabulary in bf16, so 8k tokens are one chunk (dW then needs no float32 accumulator) and
#: 16k / 32k tokens two / four chunks of 8,192. The H100 sweep (hidden 2560, bf16, fwd+bwd;
#: benchmarks/results/h100-2026-11-25-flce/) measured 8,192-token chunks fastest: 121.7 ms at
#: 32k tokens against 124.4 (4,096) and 131.0 (2,048), at +3.0 GiB against +1.9 / +1.4.
CHUNK_LOGITS_BYTES = 5 << 29
#: Chunks are multiples of this many tokens (GEMM tiles), and never smaller.
CHUNK_QUANTUM = 256
#: The environment variable that replaces :data:`CHUNK_LOGITS_BYTES` (in MiB, a whole number >= 1):
#: a smaller budget trades the loss's peak memory for more, smaller GEMMs and a float32 dW
#: accumulator (benchmarks/gpu/README.md, "The fused loss's chunk budget", has the measured trade).
CHUNK_ENV = "VEOMNI_TRITON_FLCE_CHUNK_MIB"


def chunk_budget() -> int:
    """The chunk logits budget in bytes: :data:`CHUNK_ENV` when set, else :data:`CHUNK_LOGITS_BYTES`.
    A value that is not a whole number of MiB >= 1 is a ``ValueError`` naming the variable."""
    raw = os.environ.get(CHUNK_ENV)
    if raw is None or raw.strip() == "":
        return CHUNK_LOGITS_BYTES
    try:
        mib = int(raw.strip())
    except ValueError:
        mib = 0
    if mib < 1:
        raise ValueError(f"{CHUNK_ENV}={raw!r}: the fused loss's chunk budget must be a whole number of MiB >= 1 "
                         f"(e.g. {CHUNK_ENV}=640); unset it for the default ({CHUNK_LOGITS_BYTES >> 20} MiB)")
    return mib << 20


def chunk_tokens(num_tokens: int, vocab_size: int, element_size: int, budget: int | None = None) -> int:
    """Tokens per chunk: the fewest chunks whose logits fit ``budget`` bytes each (default
    :func:`chunk_budget`), of equal size rounded up to a multiple of :data:`CHUNK_QUANTUM` (so no
    small tail chunk), at least one quantum, never more than ``num_tokens``."""
    if budget is None:
        budget = chunk_budget()
    fit = max(CHUNK_QUANTUM, budget // max(1, vocab_size * element_size) // CHUNK_QUANTUM * CHUNK_QUANTUM)
    chunks = -(-num_tokens // fit)
    even = -(-num_tokens // max(1, chunks))
    chunk = -(-even // CHUNK_QUANTUM) * CHUNK_QUANTUM
    return max(1, min(chunk, fit, num_tokens))


def fused_linear_extra(shapes: Mapping[str, int]) -> int:
    """Bytes beyond the inputs and returned gradients of one training call: the forward holds the
    per-token losses (float32), ``dH``, one chunk's logits (input dtype, the gradient written in
    place) and ``dW``, in the input dtype when the tokens fit one chunk, else a float32
    accumulator; backward casts that accumulator to the weight's dtype while it is still held."""
    n, h, v, s, f = fused_linear_shapes(shapes)
    c = chunk_tokens(n, v, s)
    single = n <= c
    forward = 4 * n + n * h * s + c * v * s + (v * h * s if single else f * v * h)
    backward_extra = 0 if single or s == f else f * v * h
    return max(0, forward - returned_grads(n, h, v, s), backward_extra)
