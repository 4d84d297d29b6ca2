"""The attention adapter through the stand-in torch_npu (``npu_fusion_attention`` computed in
float64 with its documented semantics), against the core's eager attention: the conformance
cases, then what the adapter translates -- layout, head_num under GQA, the mask convention
(True = masked), the sparse mode and its compressed mask, scale, keep_prob, the varlen layout of
packed documents -- each checked on the arguments passed and on the result; then what it
refuses, and mutations showing that a wrong translation fails here."""

from __future__ import annotations

import pytest
import torch
import torch_npu
from _helpers import assert_close, conformance, kernel
from veomni_ops.kernels.attention import eager_attention
from veomni_ops.testing.cases.attention import AttentionModule

OP = ("attention", "standard")


@pytest.fixture
def calls(monkeypatch):
    """Every call of ``npu_fusion_attention`` (positional and keyword arguments), still computed."""
    seen: list[tuple[tuple, dict]] = []
    real = torch_npu.npu_fusion_attention

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch_npu, "npu_fusion_attention", spy)
    return seen


def attn(*args, **kwargs):
    return kernel(*OP)(*args, **kwargs)


def reference(module, q, k, v, mask=None, **kwargs):
    """The core's eager attention in float64 (the contract's reference)."""
    mask = mask if mask is None or mask.dtype == torch.bool else mask.double()
    return eager_attention(module, q.double(), k.double(), v.double(), mask, **kwargs)[0]


def model_layout(b, h, s, d, dtype=torch.bfloat16):
    """``[B, H, S, D]`` as transformers makes it: a transposed view of ``[B, S, H, D]``."""
    return torch.randn(b, s, h, d).to(dtype).transpose(1, 2)


def qkv(b=2, hq=4, hk=2, s=12, d=16, sk=None, dtype=torch.bfloat16):
    sk = s if sk is None else sk
    return model_layout(b, hq, s, d, dtype), model_layout(b, hk, sk, d, dtype), model_layout(b, hk, sk, d, dtype)


def test_conformance_cases():
    results = conformance(*OP)
    assert results
    status = {r.case: r.status for r in results}
    bad = [r.describe() for r in results if r.status != "pass" and "additive" not in r.case]
    assert not bad, "\n".join(bad)
    # the kernel takes boolean masks only: an additive one is refused as an input form, not miscomputed
    assert {s for c, s in status.items() if "additive" in c} == {"unsupported"}


# --------------------------------------------------------------------------- what is passed
def test_causal_gqa_in_the_model_layout_is_bsnd_with_the_query_head_count(calls):
    module = AttentionModule(16, is_causal=True)
    q, k, v = qkv(hq=4, hk=2)
    out, weights = attn(module, q, k, v, None, scaling=0.3)
    assert weights is None and out.shape == (2, 12, 4, 16) and out.dtype == torch.bfloat16
    ((args, kw),) = calls
    assert args[3:] == (4, "BSND")  # head_num is Hq; the model's [B, S, H, D] passed without a copy
    assert args[1].shape == (2, 12, 2, 16)  # key/value keep their 2 heads: nothing repeated
    assert args[0].data_ptr() == q.data_ptr()
    assert kw["sparse_mode"] == 2 and kw["scale"] == 0.3 and kw["keep_prob"] == 1.0
    assert torch.equal(kw["atten_mask"], torch.ones(2048, 2048, dtype=torch.bool).triu(1))
    assert_close(out, reference(module, q, k, v, scaling=0.3), *OP, "out")


def test_contiguous_bhsd_inputs_go_as_bnsd(calls):
    module = AttentionModule(16, is_causal=False)
    q, k, v = (t.contiguous() for t in qkv())
    out, _ = attn(module, q, k, v, None, scaling=0.25)
    ((args, kw),) = calls
    assert args[4] == "BNSD" and "atten_mask" not in kw  # not causal, no mask: everything computed
    assert out.is_contiguous() and out.shape == (2, 12, 4, 16)
    assert_close(out, reference(module, q, k, v, scaling=0.25), *OP, "out")


def test_scale_defaults_to_the_module_head_dim():
    module = AttentionModule(16, is_causal=True)
    q, k, v = qkv()
    out, _ = attn(module, q, k, v, None)
    assert_close(out, reference(module, q, k, v), *OP, "out")


def test_a_boolean_mask_goes_negated(calls):
    module = AttentionModule(16, is_causal=True)
    q, k, v = qkv(b=2, hq=4, hk=2, s=9)
    allowed = torch.rand(2, 1, 9, 9) > 0.4
    allowed[..., 0] = True  # every row attends to something
    out, _ = attn(module, q, k, v, allowed, scaling=0.25)
    ((args, kw),) = calls
    assert torch.equal(kw["atten_mask"], ~allowed) and kw.get("sparse_mode", 0) == 0
    assert_close(out, reference(module, q, k, v, allowed, scaling=0.25), *OP, "out")


def test_a_per_head_mask_of_a_batch_of_one_row_shape_is_expanded_to_bnss(calls):
    module = AttentionModule(16, is_causal=False)
    q, k, v = qkv(b=2, hq=4, hk=2, s=6)
    allowed = torch.rand(1, 4, 6, 6) > 0.3
    allowed[..., 0] = True
    out, _ = attn(module, q, k, v, allowed, scaling=0.25)
    assert calls[0][1]["atten_mask"].shape == (2, 4, 6, 6)  # 1NSS is not a documented mask shape
    assert_close(out, reference(module, q, k, v, allowed, scaling=0.25), *OP, "out")


def test_left_padding_rows_with_no_key_stay_finite_and_the_rest_match():
    module = AttentionModule(16, is_causal=True)
    q, k, v = (t.detach().requires_grad_() for t in qkv(b=2, s=8))
    lens = torch.tensor([8, 5])
    valid = torch.arange(8)[None, :] >= (8 - lens)[:, None]  # left padding: row 1 starts at position 3
    allowed = valid[:, None, None, :] & torch.ones(8, 8, dtype=torch.bool).tril()  # padded queries see nothing
    out, _ = attn(module, q, k, v, allowed, scaling=0.25)
    out.float().sum().backward()
    assert torch.isfinite(out.float()).all() and all(torch.isfinite(t.grad.float()).all() for t in (q, k, v))
    want = reference(module, q.detach(), k.detach(), v.detach(), allowed, scaling=0.25)
    assert_close(out[valid], want[valid], *OP, "out on real tokens")


def test_a_2d_padding_mask_is_the_key_mask_with_the_causal_triangle():
    module = AttentionModule(16, is_causal=True)
    q, k, v = qkv(b=3, s=10)
    valid = torch.arange(10)[None, :] < torch.tensor([10, 7, 4])[:, None]
    out, _ = attn(module, q, k, v, valid.long(), scaling=0.25)
    four_d = valid[:, None, None, :] & torch.ones(10, 10, dtype=torch.bool).tril()
    want = reference(module, q, k, v, four_d, scaling=0.25)
    assert_close(out[valid], want[valid], *OP, "out on real tokens")


@pytest.mark.parametrize("sq, sk", [(10, 10), (4, 10)])
def test_sliding_window_is_an_end_aligned_mask_and_a_band(calls, sq, sk):
    module = AttentionModule(16, is_causal=True)
    q, k, v = qkv(b=1, s=sq, sk=sk)
    out, _ = attn(module, q, k, v, None, scaling=0.25, sliding_window=3)
    ((_, kw),) = calls
    assert kw["atten_mask"].shape == (sq, sk) and kw.get("sparse_mode", 0) == 0
    if sq == sk:  # the band of the mask: 2 keys before the query and none after
        assert (kw["pre_tockens"], kw["next_tockens"]) == (2, 0)
    else:
        assert "pre_tockens" not in kw
    assert_close(out, reference(module, q, k, v, scaling=0.25, sliding_window=3), *OP, "out")


def test_causal_with_more_keys_than_queries_is_top_left_as_eager():
    module = AttentionModule(16, is_causal=True)
    q, k, v = qkv(b=1, s=4, sk=9)
    out, _ = attn(module, q, k, v, None, scaling=0.25)
    assert_close(out, reference(module, q, k, v, scaling=0.25), *OP, "out")


@pytest.mark.parametrize("causal", [True, False])
def test_packed_documents_go_as_tnd_with_cumulative_ends(calls, causal):
    module = AttentionModule(16, is_causal=causal)
    q, k, v = (t.detach().requires_grad_() for t in qkv(b=1, hq=4, hk=1, s=13))
    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    packing = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 7, "max_length_k": 7}
    out, _ = attn(module, q, k, v, None, scaling=0.25, **packing)
    ((args, kw),) = calls
    assert args[3:] == (4, "TND") and args[0].shape == (13, 4, 16) and args[1].shape == (13, 1, 16)
    assert kw["actual_seq_qlen"] == kw["actual_seq_kvlen"] == [5, 6, 13]
    assert kw["sparse_mode"] == (3 if causal else 0) and (kw["atten_mask"] is None) != causal
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = eager_attention(module, *leaves, None, scaling=0.25, **packing)[0]
    assert_close(out, want, *OP, "out")
    cot = torch.randn(out.shape)
    out.backward(cot.to(out.dtype))
    want.backward(cot.to(out.dtype).double())
    for t, ref, name in zip((q, k, v), leaves, "qkv"):
        assert_close(t.grad, ref.grad, *OP, f"grad {name}")


def test_packed_documents_with_a_window_take_the_dense_block_mask(calls):
    module = AttentionModule(16, is_causal=True)
    q, k, v = qkv(b=1, s=12)
    cu = torch.tensor([0, 7, 12])
    out, _ = attn(module, q, k, v, None, scaling=0.25, sliding_window=3, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    ((args, kw),) = calls
    assert args[4] != "TND" and kw["atten_mask"].shape[-2:] == (12, 12)
    want = reference(module, q, k, v, scaling=0.25, sliding_window=3, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    assert_close(out, want, *OP, "out")


def test_restarting_position_ids_are_honoured():
    module = AttentionModule(16, is_causal=True)
    q, k, v = qkv(b=1, s=10)
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]])
    out, _ = attn(module, q, k, v, None, scaling=0.25, position_ids=pos)
    want = reference(module, q, k, v, scaling=0.25, position_ids=pos)
    assert_close(out, want, *OP, "out")
    plain = reference(module, q, k, v, scaling=0.25)
    assert not torch.allclose(out.double(), plain, atol=1e-2)  # the documents really are kept apart


def test_dropout_is_keep_prob_while_training(calls):
    module = AttentionModule(16, is_causal=True)
    q, k, v = qkv()
    attn(module, q, k, v, None, dropout=0.1)  # eval: transformers' modules pass 0.0 there anyway
    module.train()
    attn(module, q, k, v, None, dropout=0.1)
    assert [kw["keep_prob"] for _, kw in calls] == [1.0, pytest.approx(0.9)]
    with pytest.raises(ValueError, match="dropout=1.0 must be in"):
        attn(module, q, k, v, None, dropout=1.0)


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("kwargs, says", [
    ({"softcap": 30.0}, "softcap=30.0 cannot be honoured"),
    ({"s_aux": torch.zeros(4)}, "attention sinks"),
    ({"position_bias": torch.zeros(1)}, "position_bias"),
    ({"max_length_q": 12}, "max_length_q is given without cu_seq_lens_q"),
    ({"cu_seq_lens_q": torch.tensor([0, 12]), "cu_seq_lens_k": torch.tensor([0, 12])}, "batch of one row"),
])
def test_what_it_cannot_honour_is_refused(kwargs, says):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=says):
        attn(AttentionModule(16, is_causal=True), q, k, v, None, **kwargs)


def test_additive_masks_and_float32_are_refused():
    q, k, v = qkv(s=6)
    module = AttentionModule(16, is_causal=True)
    with pytest.raises(ValueError, match="additive"):
        attn(module, q, k, v, torch.zeros(2, 1, 6, 6, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="float32; Ascend's npu_fusion_attention kernels take"):
        attn(module, *(t.float() for t in (q, k, v)), None)


def test_documented_limits_are_checked():
    module = AttentionModule(1024, is_causal=True)
    with pytest.raises(ValueError, match="head dims up to 768"):
        attn(module, *qkv(b=1, s=2, d=1024), None)
    q, k, v = qkv(b=1, s=1100, d=8)
    cu = torch.arange(0, 1101)  # 1100 one-token documents
    with pytest.raises(ValueError, match="at most 1024"):
        attn(AttentionModule(8, is_causal=True), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)


# --------------------------------------------------------------------------- mutations
def _mutated(monkeypatch, change):
    real = torch_npu.npu_fusion_attention

    def wrong(*args, **kwargs):
        args, kwargs = change(list(args), dict(kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch_npu, "npu_fusion_attention", wrong)
    return [r for r in conformance(*OP) if "additive" not in r.case]


def _negate_mask(args, kw):
    if kw.get("atten_mask") is not None and kw.get("sparse_mode", 0) == 0:
        kw["atten_mask"] = ~kw["atten_mask"]
    return args, kw


@pytest.mark.parametrize("change, why", [
    (_negate_mask, "the mask passed as True = attend"),
    (lambda a, kw: (a, {**kw, "scale": 1.0}), "the scale left at its default"),
    (lambda a, kw: (a, {**kw, "sparse_mode": 0, "atten_mask": None}), "causality dropped"),
])
def test_a_wrong_translation_fails_the_conformance_cases(monkeypatch, change, why):
    results = _mutated(monkeypatch, change)
    assert any(r.status != "pass" for r in results), why


def test_head_num_of_the_keys_is_refused_by_the_stand_in(monkeypatch):
    def key_heads(a, kw):  # head_num from the key (BSND: [B, S, N, D]; BNSD: [B, N, S, D])
        return [*a[:3], a[1].shape[2 if a[4] == "BSND" else 1], *a[4:]], kw

    results = _mutated(monkeypatch, key_heads)
    assert any(r.status == "error" and "head_num" in r.message for r in results)
