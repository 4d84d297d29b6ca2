"""What the cross-entropy kernels allocate beyond their inputs and returned gradients.

Each function here is a :attr:`~veomni_ops.spec.KernelSpec.extra_memory`: it takes the op's
shapes (``tokens`` N, ``hidden`` H, ``vocab`` V, ``itemsize`` s, the bytes of one element in
the input dtype) and returns bytes, the peak of one training call (forward and backward) beyond
the inputs and the gradients it hands back (``dH [N, H]`` and ``dW [V, H]`` in the input dtype).
That is what ``veomni-ops bench`` measures as ``extra_gib``; the formulas are read off the
kernels' allocations and checked against the H100 measurement
``benchmarks/results/h100-2026-11-26-issue24/callA/bench-flce.json`` (core/tests/test_memory_budget.py).

Nothing here imports torch: spec modules import it. The core's chunk rule lives here for the
same reason (:mod:`.kernel` uses it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

#: Upper bound on one chunk's float32 logits in the core's ``chunked`` kernel.
CHUNK_LOGITS_BUDGET_BYTES = 512 * 2**20
#: The chunked kernel splits the tokens into at least this many chunks (when N allows).
MIN_CHUNKS = 8
#: ...but no chunk is smaller than this many tokens (tiny matmuls waste the device).
MIN_CHUNK_TOKENS = 32

#: The shapes a ``fused_linear`` kernel's ``extra_memory`` takes.
SHAPE_KEYS = ("tokens", "hidden", "vocab", "itemsize")


def default_chunk_size(num_tokens: int, vocab_size: int) -> int:
    """Tokens per chunk for the chunked kernel.

    At most :data:`CHUNK_LOGITS_BUDGET_BYTES` of float32 logits per chunk and at least
    :data:`MIN_CHUNKS` chunks, so a chunk's logits stay a small fraction of what the eager
    path holds (it keeps several ``[N, V]`` tensors alive); never below
    :data:`MIN_CHUNK_TOKENS` tokens, rounded down to a multiple of 64 when larger (matmul
    tiles).
    """
    by_budget = max(1, CHUNK_LOGITS_BUDGET_BYTES // (4 * max(1, vocab_size)))
    by_count = math.ceil(num_tokens / MIN_CHUNKS)
    chunk = max(MIN_CHUNK_TOKENS, min(by_budget, by_count))
    if chunk > 64:
        chunk = chunk // 64 * 64
    return max(1, min(chunk, num_tokens))


def fused_linear_shapes(shapes: Mapping[str, int]) -> tuple[int, int, int, int, int]:
    """``(N, H, V, s, f)`` of ``shapes``: f is the float width the loss is computed in (8 for
    float64 inputs, else 4). A missing key is a :class:`KeyError` naming the keys wanted."""
    missing = [k for k in SHAPE_KEYS if k not in shapes]
    if missing:
        raise KeyError(f"cross_entropy fused_linear shapes need {', '.join(SHAPE_KEYS)}; missing {', '.join(missing)}")
    n, h, v, s = (int(shapes[k]) for k in SHAPE_KEYS)
    return n, h, v, s, 8 if s == 8 else 4


def returned_grads(n: int, h: int, v: int, s: int) -> int:
    """Bytes of the gradients a fused linear loss hands back: ``dH [N, H]`` and ``dW [V, H]``."""
    return (n + v) * h * s


def logits_path_bytes(shapes: Mapping[str, int]) -> int:
    """The ``logits`` path's own cost beyond the head's inputs: the logits ``[N, V]`` in the input
    dtype, which the model makes (and returns) and the ``fused_linear`` kernels never hold."""
    n, _, v, s, _ = fused_linear_shapes(shapes)
    return n * v * s


def eager_logits_extra(shapes: Mapping[str, int]) -> int:
    """``eager`` ``logits`` (inputs: the logits ``[N, V]``; returned: their gradient): the forward
    holds the logits' float32 copy and log-softmax, backward the log-softmax, its incoming gradient
    and the float32 gradient of the logits before the returned one (input dtype) exists."""
    n, _, v, s, f = fused_linear_shapes(shapes)
    forward = n * v * ((f if s != f else 0) + f)
    return max(0, max(forward, 3 * n * v * f) - n * v * s, n * v * f if s != f else 0)


def eager_extra(shapes: Mapping[str, int]) -> int:
    """``eager``: the forward holds the logits ``[N, V]`` (s), their float32 copy and the
    log-softmax (f, kept for backward); backward holds the log-softmax, its incoming gradient and
    the logits' gradient (3 x f per logit) before the input gradients exist."""
    n, h, v, s, f = fused_linear_shapes(shapes)
    upcast = f if s != f else 0
    forward = n * v * (s + upcast + f)
    backward = 3 * n * v * f
    return max(0, max(forward, backward) - returned_grads(n, h, v, s))


def chunked_extra(shapes: Mapping[str, int]) -> int:
    """``chunked``: a float32 ``dW`` accumulator ``[V, H]`` and ``dH`` (computed in the forward,
    kept until backward), and one chunk's logits (s), their float32 copy and log-softmax (f);
    backward adds the returned gradients while the accumulator and ``dH`` are still held."""
    n, h, v, s, f = fused_linear_shapes(shapes)
    c = default_chunk_size(n, v)
    upcast = f if s != f else 0
    forward = f * v * h + n * h * s + c * v * (s + upcast + f)
    backward_extra = f * v * h + n * h * s
    return max(0, forward - returned_grads(n, h, v, s), backward_extra)
