"""The fused_npu MoE adapter through the stand-in torch_npu, against the core's eager reference:
conformance cases (idle experts, one hot expert, duplicate routes, strided hidden states;
forward and backward), the grouped-matmul autograd the adapter supplies, the arguments it
passes to torch_npu, expert-parallel sentinel routes and input validation."""

from __future__ import annotations

import pytest
import torch
import torch_npu
from _helpers import assert_all_pass, assert_close, conformance, kernel
from veomni_npu.kernels import moe as npu_moe
from veomni_ops.kernels.moe import moe_experts_eager

DIFF = ("hidden_states", "top_k_weights", "gate_up_proj", "down_proj")


def test_conformance_cases():
    assert_all_pass(conformance("moe_experts", "standard"))


def _inputs(t, e, k, h, i, dtype=torch.float32, index=None):
    if index is None:
        index = torch.rand(t, e).argsort(dim=1)[:, :k]
    return {
        "hidden_states": torch.randn(t, h).to(dtype),
        "top_k_index": index,
        "top_k_weights": torch.rand(t, k).softmax(-1).to(dtype),
        "gate_up_proj": (torch.randn(e, 2 * i, h) / h**0.5).to(dtype),
        "down_proj": (torch.randn(e, h, i) / i**0.5).to(dtype),
    }


def _run(fn, inp, cot=None, double=False):
    leaves = {n: (inp[n].detach().double() if double else inp[n].detach().clone()).requires_grad_(True) for n in DIFF}
    out = fn(leaves["hidden_states"], inp["top_k_index"], leaves["top_k_weights"], leaves["gate_up_proj"],
             leaves["down_proj"])
    cot = torch.randn_like(out) if cot is None else cot.to(out.dtype)
    out.backward(cot)
    return out, {n: leaves[n].grad for n in DIFF}, cot


def _compare(inp, ref_inp=None, weights_mask=None):
    out, grads, cot = _run(kernel("moe_experts", "standard"), inp)
    ref_out, ref_grads, _ = _run(moe_experts_eager, ref_inp or inp, cot, double=True)
    assert_close(out, ref_out, "moe_experts", "standard", "out")
    for n in DIFF:
        assert grads[n] is not None, f"no gradient for {n}"
        got, want = grads[n], ref_grads[n]
        if n == "top_k_weights" and weights_mask is not None:
            got, want = got[weights_mask], want[weights_mask]
        assert_close(got, want, "moe_experts", "standard", f"d{n}")
    return grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_expert_parallel_sentinel_routes_contribute_nothing(dtype):
    # transformers marks routes to experts of another rank with index E (or -1 elsewhere).
    inp = _inputs(9, 4, 2, 16, 8, dtype)
    idx = inp["top_k_index"].clone()
    idx[::3, 1] = 4
    idx[1, 0] = -1
    inp["top_k_index"] = idx
    # Reference: the same routes with weight 0 sent to a real expert contribute nothing either.
    dropped = (idx < 0) | (idx >= 4)
    ref = dict(inp, top_k_index=torch.where(dropped, torch.zeros_like(idx), idx),
               top_k_weights=torch.where(dropped, torch.zeros_like(inp["top_k_weights"]), inp["top_k_weights"]))
    # (The reference's gradient for those zero weights is not zero; the kernel's is: a dropped
    # route is not part of this rank's loss.)
    grads = _compare(inp, ref, weights_mask=~dropped)
    assert torch.equal(grads["top_k_weights"][dropped], torch.zeros_like(grads["top_k_weights"][dropped]))


@pytest.mark.parametrize("bad", [5, -2, 100])
def test_expert_index_outside_the_sentinels_is_an_error_naming_it(bad):
    # E = 4: -1 and 4 route nowhere; anything else outside [0, 4) is a routing bug.
    inp = _inputs(6, 4, 2, 16, 8)
    idx = inp["top_k_index"].clone()
    idx[2, 1] = bad
    idx[0, 0] = 4
    with pytest.raises(ValueError, match=rf"moe_experts \(npu\): top_k_index holds {bad}, .*E = 4"):
        kernel("moe_experts", "standard")(*dict(inp, top_k_index=idx).values())


def test_a_single_expert_and_no_tokens():
    _compare(_inputs(7, 1, 1, 8, 8))  # E = 1: one group (group_list_type=0 allows it)
    empty = _inputs(0, 4, 2, 8, 8)
    out = kernel("moe_experts", "standard")(*empty.values())
    assert out.shape == (0, 8)


def test_int32_indices_and_float32_routing_weights_with_bf16_activations():
    inp = _inputs(11, 6, 3, 16, 16, torch.bfloat16)
    inp["top_k_index"] = inp["top_k_index"].to(torch.int32)
    inp["top_k_weights"] = torch.rand(11, 3).softmax(-1)  # float32 router output
    out, grads, _ = _run(kernel("moe_experts", "standard"), inp)
    assert out.dtype == torch.bfloat16 and grads["top_k_weights"].dtype == torch.float32
    ref_inp = dict(inp, top_k_index=inp["top_k_index"].long())
    _compare(inp, ref_inp)


def _loop_gmm(x, w, ends):
    out, start = [], 0
    for e, end in enumerate(ends.tolist()):
        out.append(x[start:end] @ w[e])
        start = end
    return torch.cat(out)


def test_grouped_matmul_autograd_against_a_loop_with_an_empty_group():
    # torch_npu's npu_grouped_matmul has no autograd formula: the adapter's function supplies
    # dX (M grouped) and dW (K grouped, one block per expert, zeros for an idle expert).
    x = torch.randn(10, 6, requires_grad=True)
    w = torch.randn(4, 6, 5, requires_grad=True)
    ends = torch.tensor([3, 3, 7, 10])  # expert 1 gets no row
    y = npu_moe._GroupedMatmul.apply(x, w, ends)
    cot = torch.randn_like(y)
    y.backward(cot)
    x2, w2 = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    y2 = _loop_gmm(x2, w2, ends)
    y2.backward(cot)
    torch.testing.assert_close(y, y2)
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)
    assert torch.equal(w.grad[1], torch.zeros_like(w.grad[1]))


def test_arguments_passed_to_torch_npu(monkeypatch):
    calls = []
    real = torch_npu.npu_grouped_matmul

    def spy(x, weight, **kw):
        calls.append((tuple(x[0].shape), tuple(weight[0].shape), kw))
        return real(x, weight, **kw)

    monkeypatch.setattr(torch_npu, "npu_grouped_matmul", spy)
    inp = _inputs(5, 3, 2, 8, 4)
    _run(kernel("moe_experts", "standard"), inp)
    fwd = [c for c in calls if c[2]["group_type"] == 0]
    dw = [c for c in calls if c[2]["group_type"] == 2]
    assert len(calls) == 6 and len(fwd) == 4 and len(dw) == 2  # 2 forward, 2 dX, 2 dW
    for _, _, kw in calls:
        assert kw["group_list_type"] == 0 and kw["group_list"].dtype == torch.int64 and kw["bias"] is None
        assert kw["group_list"].tolist()[-1] == 10  # cumsum ends at T*K routes
    assert {kw["split_item"] for _, _, kw in fwd} == {2} and {kw["split_item"] for _, _, kw in dw} == {3}
    # gate_up: [T*K, H] @ [E, H, 2I]; down: [T*K, I] @ [E, I, H]; dW blocks from x^T [K', T*K] @ dY [T*K, N]
    assert (calls[0][0], calls[0][1]) == ((10, 8), (3, 8, 8))
    assert (calls[1][0], calls[1][1]) == ((10, 4), (3, 4, 8))
    assert sorted((c[0], c[1]) for c in dw) == [((4, 10), (10, 8)), ((8, 10), (10, 8))]


def test_validation_names_the_documented_limits():
    fn = kernel("moe_experts", "standard")
    inp = _inputs(4, 3, 2, 8, 4)
    with pytest.raises(ValueError, match="1 to 512 routes"):
        big = _inputs(2, 600, 513, 8, 4)
        fn(*big.values())
    with pytest.raises(ValueError, match="1 to 1024 groups"):
        fn(inp["hidden_states"], inp["top_k_index"], inp["top_k_weights"], torch.zeros(1025, 8, 8),
           torch.zeros(1025, 8, 4))
    with pytest.raises(ValueError, match="below 65536"):
        h = 65536
        fn(torch.zeros(1, h), torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1), torch.zeros(1, 2, h),
           torch.zeros(1, h, 1))
    with pytest.raises(ValueError, match=r"\[E, H, I\]"):
        fn(inp["hidden_states"], inp["top_k_index"], inp["top_k_weights"], inp["gate_up_proj"], torch.zeros(3, 8, 5))
    with pytest.raises(TypeError, match="integer"):
        fn(inp["hidden_states"], inp["top_k_index"].float(), inp["top_k_weights"], inp["gate_up_proj"],
           inp["down_proj"])
    with pytest.raises(TypeError, match="different dtypes"):
        fn(inp["hidden_states"].half(), inp["top_k_index"], inp["top_k_weights"], inp["gate_up_proj"],
           inp["down_proj"])
