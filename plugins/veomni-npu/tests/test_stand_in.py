"""The stand-in torch_npu against the documented formulas, and proof that the adapter tests
can fail: wrong adapters (swapped SwiGLU halves, an offset norm without the offset, an MoE
without its grouped-matmul backward) must not pass the conformance cases through it."""

from __future__ import annotations

import torch
import torch_npu
from _helpers import spec_for
from veomni_ops.testing.runner import check_kernel


def test_it_is_the_stand_in():
    assert torch_npu.IS_STAND_IN is True


def test_permute_follows_the_documented_formula():
    # permuteTokens[sortedIndices[i]] = tokens[i // topK]; sortedIndices = argsort(argsort(flatten(indices)))
    tokens = torch.randn(6, 4)
    indices = torch.tensor([[2, 0], [1, 2], [0, 1], [2, 2], [1, 0], [0, 0]])
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(tokens, indices)
    assert sorted_indices.dtype == torch.int32 and permuted.shape == (12, 4)
    for i in range(12):
        assert torch.equal(permuted[sorted_indices[i]], tokens[i // 2])
    # grouped by expert, in expert order
    experts_in_order = indices.reshape(-1)[torch.argsort(sorted_indices.long())]
    assert torch.equal(experts_in_order, experts_in_order.sort().values)


def test_unpermute_is_the_weighted_sum_over_routes():
    tokens = torch.randn(5, 3)
    indices = torch.randint(0, 4, (5, 2))
    probs = torch.rand(5, 2)
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(tokens, indices)
    out = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs=probs)
    torch.testing.assert_close(out, tokens * probs.sum(-1, keepdim=True))


def test_grouped_matmul_forms():
    x = torch.randn(7, 3)
    w = torch.randn(3, 3, 2)
    ends = torch.tensor([2, 2, 7])
    (y,) = torch_npu.npu_grouped_matmul([x], [w], group_list=ends, split_item=2, group_type=0, group_list_type=0)
    torch.testing.assert_close(y, torch.cat([x[:2] @ w[0], x[2:7] @ w[2]]))
    (y1,) = torch_npu.npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 0, 5]), split_item=2, group_type=0,
                                         group_list_type=1)
    torch.testing.assert_close(y1, y)
    g = torch.randn(7, 2)
    (dw,) = torch_npu.npu_grouped_matmul([x.t()], [g], group_list=ends, split_item=3, group_type=2, group_list_type=0)
    torch.testing.assert_close(dw, torch.stack([x[:2].t() @ g[:2], torch.zeros(3, 2), x[2:].t() @ g[2:]]))
    # like torch_npu (no autograd formula), the result is not part of the graph
    (yg,) = torch_npu.npu_grouped_matmul([x.requires_grad_()], [w], group_list=ends, split_item=2, group_type=0)
    assert not yg.requires_grad


def test_rms_norm_dtype_pairs_are_the_documented_ones():
    x = torch.randn(2, 8)
    try:
        torch_npu.npu_rms_norm(x, torch.ones(8, dtype=torch.bfloat16))
    except RuntimeError as e:
        assert "unsupported dtype pair" in str(e)
    else:
        raise AssertionError("the stand-in accepted float32 x with a bfloat16 gamma (not a documented pair)")
    y, rstd = torch_npu.npu_rms_norm(x.bfloat16(), torch.ones(8))
    assert y.dtype == torch.bfloat16 and rstd.dtype == torch.float32 and rstd.shape == (2, 1)


# --------------------------------------------------------------------------- the tests can fail
def _fails(fn, op, variant, dtypes=("float32",)) -> bool:
    results = check_kernel(fn, spec_for(op, variant), device="cpu", size="small", dtypes=dtypes, seed=7)
    return any(r.status != "pass" for r in results)


def test_swapped_swiglu_halves_fail():
    def wrong(gate, up):
        return torch_npu.npu_swiglu(torch.cat((up, gate), dim=-1), dim=-1)

    assert _fails(wrong, "swiglu", "standard")


def test_offset_norm_without_the_offset_fails():
    def wrong(hidden_states, weight, eps):
        return torch_npu.npu_rms_norm(hidden_states, weight.float(), epsilon=eps)[0]

    assert _fails(wrong, "rms_norm", "offset")


def test_moe_without_its_grouped_matmul_backward_fails():
    from veomni_npu.kernels import moe

    def wrong(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj):
        class NoBackward:
            @staticmethod
            def apply(x, w, ends):
                return moe._gmm(x, w, ends, group_type=0, split_item=2)

        saved = moe._GroupedMatmul
        moe._GroupedMatmul = NoBackward
        try:
            return moe.moe_experts(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj)
        finally:
            moe._GroupedMatmul = saved

    assert _fails(wrong, "moe_experts", "standard")
