"""The MoE adapter runs Liger's fused MoE kernels (GPU, or the Triton interpreter on CPU).

Under the interpreter one forward costs ~15 s whatever the size (Liger's routing kernel
bitonic-sorts a fixed block of 1024 entries, slowly in Python), so one call carries every
routing edge case at once; bfloat16 (its ``tl.dot`` computes on raw bits there) and the
production shapes are checked on a GPU by ``veomni-ops check --backend veomni-liger``.
"""

from __future__ import annotations

import pytest
import torch
import veomni_liger.kernels.moe as moe
from _helpers import assert_close, core_kernels, interpreter_active


def _reference(x, idx, w, gate_up, down):
    """Float64 per-route reference of the contract: sum_k w_tk * down[e] @ (silu(g) * u)."""
    x, w, gate_up, down = (t.double() for t in (x, w, gate_up, down))
    out = torch.zeros_like(x)
    inter = gate_up.shape[1] // 2
    for t in range(x.shape[0]):
        for k in range(idx.shape[1]):
            e = int(idx[t, k])
            if not 0 <= e < gate_up.shape[0]:
                continue  # -1 / E: the expert-parallel sentinels route nowhere
            gu = gate_up[e] @ x[t]
            y = down[e] @ (torch.nn.functional.silu(gu[:inter]) * gu[inter:])
            out[t] = out[t] + w[t, k] * y
    return out


def _edge_case_routing(tokens: int, experts: int, device, sentinels: bool = False) -> torch.Tensor:
    """Route 0 sends every token to expert 0; route 1 spreads over experts 0..E-2, never E-1.

    So: one expert gets every token (more than one 64-row tile), one gets none, and token 0
    lists expert 0 twice. With ``sentinels``, some routes of both columns go nowhere: E on
    every 5th token's route 1, -1 on every 7th token's route 0 (the contract's expert-parallel
    sentinels).
    """
    idx = torch.empty(tokens, 2, dtype=torch.long, device=device)
    idx[:, 0] = 0
    idx[:, 1] = torch.arange(tokens, device=device) % (experts - 1)
    if sentinels:
        idx[3::5, 1] = experts
        idx[2::7, 0] = -1
    return idx


def test_forward_backward_edge_cases_against_float64(device):
    dtype = torch.float32
    t, h, i, e = 70, 32, 16, 4
    x = torch.randn(t, h, device=device, dtype=dtype, requires_grad=True)
    gate_up = (torch.randn(e, 2 * i, h, device=device, dtype=dtype) / h**0.5).requires_grad_()
    down = (torch.randn(e, h, i, device=device, dtype=dtype) / i**0.5).requires_grad_()
    idx = _edge_case_routing(t, e, device, sentinels=True)
    w = torch.rand(t, 2, device=device, dtype=dtype).requires_grad_()
    out = moe.moe_experts(x, idx, w, gate_up, down)
    assert out.shape == (t, h) and out.dtype == dtype

    leaves64 = [p.detach().double().requires_grad_() for p in (x, w, gate_up, down)]
    ref = _reference(leaves64[0], idx, *leaves64[1:])
    assert_close(out, ref, "moe_experts", "standard", "output")

    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g.double())
    for name, got, want in zip(["dx", "dweights", "dgate_up", "ddown"], (x, w, gate_up, down), leaves64):
        assert_close(got.grad, want.grad, "moe_experts", "standard", name)
    # The expert no token chose gets exactly zero weight gradients.
    assert torch.equal(gate_up.grad[e - 1], torch.zeros_like(gate_up.grad[e - 1]))
    assert torch.equal(down.grad[e - 1], torch.zeros_like(down.grad[e - 1]))
    # Sentinel routes (-1, E) contribute nothing: their routing weights get zero gradient.
    sentinel = (idx == -1) | (idx == e)
    assert sentinel[:, 0].any() and sentinel[:, 1].any()
    assert torch.equal(w.grad[sentinel], torch.zeros_like(w.grad[sentinel]))

    # And the core's eager reference (transformers' loop) agrees on the output.
    core = core_kernels("moe")
    eager = core.moe_experts_eager(x.detach(), idx, w.detach(), gate_up.detach(), down.detach())
    assert_close(out, eager, "moe_experts", "standard", "output vs core eager")


def test_zero_tokens(device):
    h, i, e = 8, 4, 3
    x = torch.randn(0, h, device=device, requires_grad=True)
    gate_up = torch.randn(e, 2 * i, h, device=device)
    down = torch.randn(e, h, i, device=device)
    out = moe.moe_experts(x, torch.zeros(0, 2, dtype=torch.long, device=device), torch.zeros(0, 2, device=device),
                          gate_up, down)
    assert out.shape == (0, h)


def _args(device, **over):
    t, h, i, e, k = 3, 8, 4, 3, 2
    a = {
        "hidden_states": torch.randn(t, h, device=device),
        "top_k_index": torch.zeros(t, k, dtype=torch.long, device=device),
        "top_k_weights": torch.rand(t, k, device=device),
        "gate_up_proj": torch.randn(e, 2 * i, h, device=device),
        "down_proj": torch.randn(e, h, i, device=device),
    }
    a.update(over)
    return a


@pytest.mark.parametrize(
    "over, exc, match",
    [
        # E = 3: -1 and 3 are the sentinels (route nowhere); 4 and -2 are errors naming the index and E
        ({"top_k_index": torch.tensor([[0, 4], [1, 1], [2, 3]])}, ValueError, r"moe_experts \(liger\).* 4, .*E = 3"),
        ({"top_k_index": torch.tensor([[0, -2], [1, -1], [2, 0]])}, ValueError, r"moe_experts \(liger\).* -2, .*E = 3"),
        ({"top_k_index": torch.zeros(3, 2)}, TypeError, "integer"),
        ({"top_k_weights": torch.rand(3, 1)}, ValueError, r"\[T, K\]"),
        ({"gate_up_proj": torch.randn(3, 7, 8)}, ValueError, r"\[E, 2I, H\]"),
        ({"down_proj": torch.randn(3, 8, 5)}, ValueError, r"\[E, H, I\]"),
        ({"down_proj": torch.randn(3, 8, 4).half()}, TypeError, "different dtypes"),
        ({"hidden_states": torch.randn(1, 3, 8)}, ValueError, "2-D"),
        ({"hidden_states": torch.randn(3, 8).double()}, TypeError, "float64"),
    ],
)
def test_bad_inputs(over, exc, match):
    with pytest.raises(exc, match=match):
        moe.moe_experts(**_args("cpu", **{k: v for k, v in over.items()}))


@pytest.mark.skipif(interpreter_active(), reason="needs a GPU: bf16 tl.dot is wrong under the CPU interpreter")
def test_bfloat16_with_float32_routing_weights(device):
    t, h, i, e = 40, 64, 32, 4
    x = torch.randn(t, h, device=device, dtype=torch.bfloat16, requires_grad=True)
    gate_up = (torch.randn(e, 2 * i, h, device=device) / h**0.5).bfloat16().requires_grad_()
    down = (torch.randn(e, h, i, device=device) / i**0.5).bfloat16().requires_grad_()
    idx = _edge_case_routing(t, e, device)
    w = torch.rand(t, 2, device=device, requires_grad=True)  # float32, as routers often keep them
    out = moe.moe_experts(x, idx, w, gate_up, down)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert w.grad.dtype == torch.float32
    ref = _reference(x.detach(), idx, w.detach(), gate_up.detach(), down.detach())
    assert_close(out, ref, "moe_experts", "standard", "output (bf16)")
