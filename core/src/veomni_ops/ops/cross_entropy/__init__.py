"""The ``cross_entropy`` op (see :mod:`veomni_ops.ops`): the causal LM's token-level cross-entropy, from logits or fused with the LM head."""

from __future__ import annotations

from ..base import FLCE_EVIDENCE, VEOMNI_SOURCE, DeviceChoice, OpDef, OpInfo, PathMemory, Preference, gpu_default
from .memory import logits_path_bytes

#: The kernel contract: the docstring of the ``cross_entropy`` hook (:class:`veomni_ops.hookspecs.OpHookspecs`).
CONTRACT = """Token-level cross-entropy, returned as a **sum** over the tokens that count.

Variants and signatures::

    logits:        kernel(logits: Tensor[N, V], labels: LongTensor[N], *,
                          ignore_index: int = -100) -> Tensor[]  (float32)
    fused_linear:  kernel(hidden: Tensor[N, H], weight: Tensor[V, H], labels: LongTensor[N], *,
                          bias: Tensor[V] | None = None, ignore_index: int = -100) -> Tensor[]

The result is ``sum_i CE(z_i, labels_i)`` over ``labels_i != ignore_index``, in
float32 (logits are upcast to float32 before the log-softmax). For
``fused_linear``, ``z = hidden @ weight.T (+ bias)`` computed in the input dtype
and never held whole for all N tokens (that is its point). With every label
ignored the sum is 0 and gradients are zero. (The core's division then gives the
loss nan, 0/0, as transformers' does, and hands the kernel a zero gradient rather
than 1/0: a kernel that scales gradients stored in its forward gets no inf to
multiply. The kit's ``all-ignored-mean`` / ``-num-items-0`` cases check that.)

Labels outside ``[0, V)`` other than ``ignore_index`` are an error: ``ValueError``
naming the op and the offending label. Reading the labels costs a host
synchronisation on an accelerator, so a kernel that does not synchronise anyway
checks them with one reduction where that is free (CPU tensors) or asked for
(``VEOMNI_OPS_CHECK_VALUES=1``, the debugging switch), and otherwise must not read
out of bounds silently: it stops at a device-side assertion (PyTorch's own, in the
core's kernels). Kernels that synchronise anyway (Liger's, Quack's) always check.

The core does the rest, exactly as transformers' ``ForCausalLMLoss``: the label
shift, then division by the number of counted tokens, or by
``num_items_in_batch`` under gradient accumulation. Returning the sum is what
makes that division exact. Backward produces gradients for ``logits`` (or
``hidden``, ``weight`` and ``bias``).
"""

OP = OpDef(
    "cross_entropy", order=40, info=OpInfo(("logits", "fused_linear"), "cross_entropy_loss_implementation"),
    contract=CONTRACT, package=__name__, legacy={"chunk_loss": "chunked"},
    # VeOmni's 'npu' cross-entropy is its chunk_loss (veomni/ops/kernels/cross_entropy/__init__.py:487-506),
    # which is the core's chunked kernel.
    veomni_values={
        "liger_kernel": gpu_default("chunked", "liger", 985),
        "npu": DeviceChoice("chunked", None, "VeOmni's chunk_loss behind a torch_npu check: it requires an Ascend NPU "
                                             f"({VEOMNI_SOURCE}:975, _NPU_REQUIRED; veomni/ops/kernels/cross_entropy/"
                                             "__init__.py:500)"),
    },
    path_memory={"logits": PathMemory(logits_path_bytes, "the [N, V] logits the head makes for it")},
    compile_preferences={"cuda": (
        Preference("triton", "fused_linear", "veomni-triton's fused linear loss measured against transformers + "
                   "compile in the same run: dense 1.06x at 0.62x memory, MoE 1.07x-1.11x at 0.67x (the compiled "
                   "logits loss it replaces: 1.01x / 1.08x at 1.0x memory, another day's runs)", FLCE_EVIDENCE),
        Preference("eager", "logits", "compiled logits + cross-entropy measured 27% faster per step than the chunked "
                   "fused loss (dense model; +3.7 GiB peak: name a fused kernel to trade speed for memory)"),
    )},
)
