"""``swiglu`` contract -> ``torch_npu.npu_swiglu``.

``torch_npu.npu_swiglu(input, dim=-1)`` (torch_npu API reference) splits ``input`` in two
halves ``A, B`` along ``dim`` and returns ``swish(A) * B = A * sigmoid(A) * B``: the FIRST
half is the gate. It takes ONE tensor, so the adapter concatenates ``[gate | up]`` along the
last dimension first. That concatenation is an extra copy the contract forces: both inputs
are read and a ``[..., 2I]`` buffer written (and, in backward, autograd splits the gradient
of that buffer back into two views) -- about twice the memory traffic of the activation
alone. A model whose gate_up projection already produces the concatenated tensor (as the
MoE path does) calls ``npu_swiglu`` on it directly.

Documented limits: 1-8-D input, even size along ``dim``, no non-contiguous input (the cat
output is contiguous), no empty tensor; float32/float16/bfloat16. Listed for Atlas A2 only.
Autograd: op-plugin ``derivatives.yaml``: ``self: npu_swiglu_backward(grad, self, dim)``.
"""

from __future__ import annotations

import torch

from ._common import CHECKS, torch_npu

_OP = "swiglu"


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` elementwise; ``gate`` and ``up`` have the same shape and dtype."""
    CHECKS.check_swiglu_inputs(gate, up)
    if gate.dim() < 1:
        raise ValueError(f"{_OP} (npu): gate and up must have at least one dimension [..., I], got scalars")
    if gate.numel() == 0:
        # npu_swiglu rejects empty tensors; the result is empty either way, still part of the graph.
        return gate * up
    x = torch.cat((gate, up), dim=-1)  # [..., 2I], contiguous: the extra copy described above
    if x.dim() > 8:
        return torch_npu.npu_swiglu(x.reshape(-1, x.shape[-1]), dim=-1).reshape(gate.shape)
    return torch_npu.npu_swiglu(x, dim=-1)
