"""The FA2/FA3/FA4 adapters against a float64 reference, through the stand-in flash packages.

The stand-ins (tests/standins) have the real packages' signatures and compute in float64, so
the adapter output differs from the reference only by the final rounding to the input
dtype: the tolerances below are a few units of that rounding, far below what a wrong mask,
window, GQA mapping or unpad/re-pad would produce.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

VERSIONS = (2, 3, 4)
TOL = {torch.bfloat16: 8e-3, torch.float16: 1.5e-3}


def kernel(version: int):
    return getattr(importlib.import_module(f"veomni_flash.kernels.fa{version}"), f"flash_attention_{version}")


class Attn(torch.nn.Module):
    def __init__(self, is_causal: bool = True):
        super().__init__()
        self.is_causal = is_causal


def make_qkv(b, hq, hk, sq, d, dtype, seed, sk=None, dv=None):
    g = torch.Generator().manual_seed(seed)
    sk = sq if sk is None else sk
    dv = d if dv is None else dv
    # Built as [B, S, H, D] and transposed, like the projections of a transformers model.
    q = torch.randn(b, sq, hq, d, generator=g).to(dtype).transpose(1, 2)
    k = torch.randn(b, sk, hk, d, generator=g).to(dtype).transpose(1, 2)
    v = torch.randn(b, sk, hk, dv, generator=g).to(dtype).transpose(1, 2)
    return [t.detach().requires_grad_(True) for t in (q, k, v)]


def build_mask(b, sq, sk, *, causal=True, window=None, padding=None, segments=None):
    """Boolean [B, 1, Sq, Sk] mask from first principles; queries sit at the last Sq positions."""
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    m = torch.ones(b, 1, sq, sk, dtype=torch.bool)
    if causal:
        m &= (j <= i)[None, None]
    if window is not None:
        m &= (j > i - window)[None, None]
        if not causal:
            m &= (j < i + window)[None, None]
    if padding is not None:
        m &= padding.bool()[:, None, None, :]
    if segments is not None:
        m &= (segments[:, -sq:, None] == segments[:, None, :])[:, None]
    return m


def reference(q, k, v, mask, scaling=None, softcap=None):
    """float64 attention, [B, H, S, D] in, [B, S, H, D] out; rows with no key give 0."""
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scaling = 1 / math.sqrt(q.shape[-1]) if scaling is None else scaling
    s = q @ k.transpose(-1, -2) * scaling
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)
    return (p @ v).transpose(1, 2)


def check(version, qkv, mask, valid_q, *, dtype, module=None, attention_mask=None, scaling=None, softcap=None,
          sliding_window=None, **kwargs):
    """Forward and backward of the adapter vs the float64 reference, on the valid query rows."""
    q, k, v = qkv
    module = module or Attn()
    out, w = kernel(version)(module, q, k, v, attention_mask, scaling=scaling, softcap=softcap,
                             sliding_window=sliding_window, **kwargs)
    assert w is None
    b, hq, sq, _ = q.shape
    assert out.shape == (b, sq, hq, v.shape[-1]) and out.dtype == dtype
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in qkv)
    ref = reference(q64, k64, v64, mask, scaling, softcap)
    sel = valid_q[:, :, None, None].to(torch.float64)  # [B, Sq, 1, 1]
    tol = TOL[dtype]
    torch.testing.assert_close(out.double() * sel, ref * sel, atol=tol, rtol=tol)
    # Padded query rows come back as zeros (re-pad), not garbage.
    assert torch.all(out.double()[~valid_q] == 0)

    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    (out.double() * sel * grad.double()).sum().backward()
    (ref * sel * grad.double()).sum().backward()
    for name, a, r in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        scale = r.abs().max().item() + 1e-6
        torch.testing.assert_close(a.double() / scale, r / scale, atol=2 * tol, rtol=2 * tol, msg=name)
    return out


def all_valid(b, sq):
    return torch.ones(b, sq, dtype=torch.bool)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_causal_gqa_dense(version, dtype, calls):
    qkv = make_qkv(2, 8, 2, 7, 16, dtype, seed=1)
    check(version, qkv, build_mask(2, 7, 7), all_valid(2, 7), dtype=dtype)
    assert calls[-1]["api"].endswith(".func") and calls[-1]["causal"] is True


@pytest.mark.parametrize("version", VERSIONS)
def test_bidirectional_from_module_and_kwarg(version, calls):
    qkv = make_qkv(2, 4, 4, 6, 8, torch.bfloat16, seed=2)
    check(version, qkv, build_mask(2, 6, 6, causal=False), all_valid(2, 6), dtype=torch.bfloat16,
          module=Attn(is_causal=False))
    qkv = make_qkv(2, 4, 4, 6, 8, torch.bfloat16, seed=3)
    # The is_causal kwarg wins over the module attribute, as in transformers.
    check(version, qkv, build_mask(2, 6, 6, causal=False), all_valid(2, 6), dtype=torch.bfloat16,
          module=Attn(is_causal=True), is_causal=False)
    assert calls[-1]["causal"] is False


def padding_batch(hole: bool = True):
    """Row 0 left-padded, row 1 right-padded, row 2 with a hole (or left-padded), row 3 full.

    A hole is fine for plain causal attention (the kept tokens keep their order), but a
    sliding window counts *kept* tokens after unpadding, as in transformers' own flash path,
    whereas a 4-D mask counts positions: window tests use batches without holes.
    """
    return torch.tensor(
        [
            [0, 0, 0, 1, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 0, 0, 0, 0],
            [1, 1, 0, 0, 1, 1, 1, 1, 1] if hole else [0, 0, 0, 0, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 1, 1, 1, 1],
        ]
    )


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_padding_mask_unpad_varlen_repad(version, dtype, calls):
    pm = padding_batch()
    b, s = pm.shape
    qkv = make_qkv(b, 6, 2, s, 16, dtype, seed=4)
    check(version, qkv, build_mask(b, s, s, padding=pm), pm.bool(), dtype=dtype, attention_mask=pm)
    assert calls[-1]["api"].endswith(".varlen")
    assert calls[-1]["cu_seqlens_q"] == [0, 6, 11, 18, 27]


@pytest.mark.parametrize("version", VERSIONS)
def test_boolean_padding_mask_and_all_ones_mask(version, calls):
    pm = padding_batch().bool()
    b, s = pm.shape
    check(version, make_qkv(b, 4, 4, s, 8, torch.bfloat16, seed=5), build_mask(b, s, s, padding=pm), pm,
          dtype=torch.bfloat16, attention_mask=pm)
    ones = torch.ones(2, 5, dtype=torch.long)
    check(version, make_qkv(2, 4, 1, 5, 8, torch.bfloat16, seed=6), build_mask(2, 5, 5), all_valid(2, 5),
          dtype=torch.bfloat16, attention_mask=ones)
    assert calls[-1]["api"].endswith(".func")  # nothing padded: the dense kernel


def packed_positions(lengths):
    return torch.cat([torch.arange(n) for n in lengths])[None]


def segments_of(lengths):
    return torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packed_position_ids(version, dtype, calls):
    lengths = [5, 1, 4, 3]
    s = sum(lengths)
    qkv = make_qkv(1, 4, 2, s, 16, dtype, seed=8)
    mask = build_mask(1, s, s, segments=segments_of(lengths))
    check(version, qkv, mask, all_valid(1, s), dtype=dtype, position_ids=packed_positions(lengths))
    assert calls[-1]["api"].endswith(".varlen") and calls[-1]["cu_seqlens_q"] == [0, 5, 6, 10, 13]


@pytest.mark.parametrize("version", VERSIONS)
def test_unpacked_position_ids_stay_dense(version, calls):
    # One document that does not start at 0 (a continuation) is not a packed batch.
    qkv = make_qkv(1, 4, 2, 6, 8, torch.bfloat16, seed=9)
    check(version, qkv, build_mask(1, 6, 6), all_valid(1, 6), dtype=torch.bfloat16,
          position_ids=torch.arange(3, 9)[None])
    assert calls[-1]["api"].endswith(".func")
    # Batch > 1: position ids are per-row positions, never packing.
    qkv = make_qkv(2, 4, 2, 6, 8, torch.bfloat16, seed=10)
    check(version, qkv, build_mask(2, 6, 6), all_valid(2, 6), dtype=torch.bfloat16,
          position_ids=torch.arange(6)[None].expand(2, 6))
    assert calls[-1]["api"].endswith(".func")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("with_max", [True, False])
def test_cu_seq_lens_kwargs(version, with_max, calls):
    lengths = [3, 6, 2]
    s = sum(lengths)
    cu = torch.tensor([0, 3, 9, 11], dtype=torch.int64)  # int64 on purpose: the adapter casts
    extra = {"max_length_q": 6, "max_length_k": torch.tensor(6)} if with_max else {}
    qkv = make_qkv(1, 6, 3, s, 8, torch.bfloat16, seed=11)
    check(version, qkv, build_mask(1, s, s, segments=segments_of(lengths)), all_valid(1, s), dtype=torch.bfloat16,
          cu_seq_lens_q=cu, cu_seq_lens_k=cu, **extra)
    assert calls[-1]["cu_seqlens_q"] == [0, 3, 9, 11]


@pytest.mark.parametrize("version", VERSIONS)
def test_sliding_window_dense_padded_packed(version, calls):
    w = 3
    qkv = make_qkv(2, 4, 2, 8, 8, torch.bfloat16, seed=12)
    check(version, qkv, build_mask(2, 8, 8, window=w), all_valid(2, 8), dtype=torch.bfloat16, sliding_window=w)
    assert tuple(calls[-1]["window_size"]) == (w - 1, 0)
    pm = padding_batch(hole=False)
    qkv = make_qkv(4, 4, 2, 9, 8, torch.bfloat16, seed=13)
    check(version, qkv, build_mask(4, 9, 9, window=w, padding=pm), pm.bool(), dtype=torch.bfloat16,
          attention_mask=pm, sliding_window=w)
    lengths = [6, 5]
    qkv = make_qkv(1, 4, 2, 11, 8, torch.bfloat16, seed=14)
    check(version, qkv, build_mask(1, 11, 11, window=w, segments=segments_of(lengths)), all_valid(1, 11),
          dtype=torch.bfloat16, position_ids=packed_positions(lengths), sliding_window=w)


@pytest.mark.parametrize("version", VERSIONS)
def test_bidirectional_sliding_window(version, calls):
    w = 2
    qkv = make_qkv(1, 2, 2, 7, 8, torch.bfloat16, seed=15)
    check(version, qkv, build_mask(1, 7, 7, causal=False, window=w), all_valid(1, 7), dtype=torch.bfloat16,
          module=Attn(False), sliding_window=w)
    assert tuple(calls[-1]["window_size"]) == (w - 1, w - 1)


@pytest.mark.parametrize("version", VERSIONS)
def test_softcap_and_scaling(version, calls):
    qkv = make_qkv(2, 4, 2, 6, 16, torch.bfloat16, seed=16)
    check(version, qkv, build_mask(2, 6, 6), all_valid(2, 6), dtype=torch.bfloat16, scaling=0.9, softcap=2.5)
    assert calls[-1]["softcap"] == 2.5
    pm = padding_batch()
    qkv = make_qkv(4, 4, 2, 9, 16, torch.bfloat16, seed=17)
    check(version, qkv, build_mask(4, 9, 9, padding=pm), pm.bool(), dtype=torch.bfloat16, attention_mask=pm,
          scaling=0.5, softcap=3.0)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("sq", [1, 3])
def test_decode_queries_shorter_than_keys(version, sq):
    pm = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    b, sk = pm.shape
    qkv = make_qkv(b, 4, 2, sq, 8, torch.bfloat16, seed=18, sk=sk)
    check(version, qkv, build_mask(b, sq, sk, padding=pm), all_valid(b, sq), dtype=torch.bfloat16,
          attention_mask=pm)
    qkv = make_qkv(b, 4, 2, sq, 8, torch.bfloat16, seed=19, sk=sk)
    check(version, qkv, build_mask(b, sq, sk), all_valid(b, sq), dtype=torch.bfloat16)


@pytest.mark.parametrize("version", VERSIONS)
def test_narrower_value_head_dim(version):
    qkv = make_qkv(2, 4, 2, 5, 16, torch.bfloat16, seed=20, dv=8)
    check(version, qkv, build_mask(2, 5, 5), all_valid(2, 5), dtype=torch.bfloat16)


@pytest.mark.parametrize("version", VERSIONS)
def test_non_contiguous_inputs(version):
    # Every other head of a wider projection, and a [B, H, S, D]-contiguous query.
    g = torch.Generator().manual_seed(21)
    q = torch.randn(2, 8, 6, 16, generator=g).to(torch.bfloat16)[:, ::2].requires_grad_(True)
    k = torch.randn(2, 6, 4, 32, generator=g).to(torch.bfloat16)[..., :16].transpose(1, 2).requires_grad_(True)
    v = torch.randn(2, 6, 4, 16, generator=g).to(torch.bfloat16).transpose(1, 2).requires_grad_(True)
    assert not q.is_contiguous() and not k.is_contiguous()
    check(version, [q, k, v], build_mask(2, 6, 6), all_valid(2, 6), dtype=torch.bfloat16)


# ---- dropout ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 4])
def test_dropout_refused_while_training(version):
    q, k, v = make_qkv(1, 2, 2, 4, 8, torch.bfloat16, seed=22)
    m = Attn().train()
    with pytest.raises(ValueError, match=r"no attention dropout.*attention_dropout to 0\.0"):
        kernel(version)(m, q, k, v, None, dropout=0.1)
    # In eval the dropout is not applied anyway, so it is no reason to refuse.
    m.eval()
    out, _ = kernel(version)(m, q, k, v, None, dropout=0.1)
    assert out.shape == (1, 4, 2, 8)


def test_fa2_dropout_only_in_training(calls):
    q, k, v = make_qkv(1, 2, 2, 4, 8, torch.bfloat16, seed=23)
    m = Attn().train()
    kernel(2)(m, q, k, v, None, dropout=0.25)
    assert calls[-1]["dropout_p"] == 0.25
    m.eval()
    kernel(2)(m, q, k, v, None, dropout=0.25)
    assert calls[-1]["dropout_p"] == 0.0
    kernel(2)(m.train(), q, k, v, torch.tensor([[0, 1, 1, 1]]), dropout=0.5)
    assert calls[-1]["api"] == "fa2.varlen" and calls[-1]["dropout_p"] == 0.5


def test_deterministic_env(monkeypatch, calls):
    q, k, v = make_qkv(1, 2, 2, 4, 8, torch.bfloat16, seed=24)
    kernel(2)(Attn(), q, k, v, None)
    assert calls[-1]["deterministic"] is False
    monkeypatch.setenv("FLASH_ATTENTION_DETERMINISTIC", "1")
    kernel(2)(Attn(), q, k, v, None)
    assert calls[-1]["deterministic"] is True


# ---- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_bad_inputs_raise_with_fix(version):
    fn = kernel(version)
    q, k, v = make_qkv(1, 4, 2, 5, 8, torch.bfloat16, seed=25)
    with pytest.raises(TypeError, match="bfloat16 or float16.*dtype=torch.bfloat16"):
        fn(Attn(), q.float(), k.float(), v.float(), None)
    with pytest.raises(ValueError, match="2-D \\[batch, seq\\] padding mask.*register_attention"):
        fn(Attn(), q, k, v, torch.zeros(1, 1, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="padding mask tensor or None, got list"):
        fn(Attn(), q, k, v, [[1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        fn(Attn(), q[:, :3], k, v, None)
    with pytest.raises(ValueError, match="4-D tensor"):
        fn(Attn(), q[0], k, v, None)
    with pytest.raises(ValueError, match="both cu_seq_lens"):
        cu = torch.tensor([0, 5], dtype=torch.int32)
        fn(Attn(), q, k, v, torch.tensor([[0, 1, 1, 1, 1]]), cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    # a varlen launch bound without the packing it bounds: refused, naming it (was ignored)
    with pytest.raises(ValueError, match="max_length_q is given without cu_seq_lens_q"):
        fn(Attn(), q, k, v, None, max_length_q=5)
    with pytest.raises(ValueError, match="max_length_k is given without cu_seq_lens_k"):
        fn(Attn(), q, k, v, None, max_length_k=torch.tensor(5))
    with pytest.raises(ValueError, match="s_aux"):
        fn(Attn(), q, k, v, None, s_aux=torch.zeros(4))
    with pytest.raises(ValueError, match="sliding_window must be >= 1"):
        fn(Attn(), q, k, v, None, sliding_window=0)
    no_flag = torch.nn.Module()
    with pytest.raises(ValueError, match="is_causal"):
        fn(no_flag, q, k, v, None)


# ---- against the core's eager reference ----------------------------------------------------------


def _core_eager():
    try:
        from veomni_ops.kernels.attention import eager_attention
    except ImportError as e:  # the core's reference kernels are written in parallel
        pytest.skip(f"veomni_ops.kernels.attention.eager_attention not importable ({e}); compared to own reference")
    return eager_attention


CORE_CASES = {
    "causal_gqa": dict(b=2, s=7, hq=8, hk=2),
    "padding": dict(padding=True),
    "packed": dict(packed=[4, 2, 5]),
    "window": dict(b=2, s=9, hq=4, hk=2, window=4),
    "softcap": dict(b=2, s=6, hq=4, hk=1, softcap=4.0, scaling=0.4),
    "window_padding_softcap": dict(padding=True, window=3, softcap=6.0),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", list(CORE_CASES))
def test_matches_core_eager(version, case):
    eager_attention = _core_eager()
    c = CORE_CASES[case]
    kwargs: dict = {}
    attention_mask = None
    if c.get("padding"):
        pm = padding_batch(hole=not c.get("window"))
        b, s = pm.shape
        hq, hk = 6, 3
        valid = pm.bool()
        attention_mask = pm
    elif c.get("packed"):
        b, s, hq, hk = 1, sum(c["packed"]), 4, 2
        valid = all_valid(b, s)
        kwargs["position_ids"] = packed_positions(c["packed"])
    else:
        b, s, hq, hk = c["b"], c["s"], c["hq"], c["hk"]
        valid = all_valid(b, s)
    mask = build_mask(
        b, s, s, window=c.get("window"), padding=attention_mask,
        segments=segments_of(c["packed"]) if c.get("packed") else None,
    )
    q, k, v = make_qkv(b, hq, hk, s, 16, torch.bfloat16, seed=30)
    out, _ = kernel(version)(Attn(), q, k, v, attention_mask, scaling=c.get("scaling"), softcap=c.get("softcap"),
                             sliding_window=c.get("window"), **kwargs)
    m = Attn().eval()
    scaling = c.get("scaling") or 16 ** -0.5
    # The core's eager takes the 4-D mask transformers would build for it: it encodes everything.
    ref, _ = eager_attention(m, q.double(), k.double(), v.double(), mask, scaling=scaling, softcap=c.get("softcap"))
    sel = valid[:, :, None, None]
    torch.testing.assert_close(out.double() * sel, ref * sel, atol=8e-3, rtol=8e-3)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("form", ["position_ids", "cu_seq_lens"])
def test_core_eager_honours_the_same_packing_arguments(version, form):
    # The packing kwargs alone (no 4-D mask): flash runs varlen, the core's eager builds the
    # block-diagonal mask itself; both keep every document to itself.
    eager_attention = _core_eager()
    lengths = [4, 2, 5]
    s = sum(lengths)
    if form == "position_ids":
        kwargs = {"position_ids": packed_positions(lengths)}
    else:
        cu = torch.tensor([0, 4, 6, 11], dtype=torch.int32)
        kwargs = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 5, "max_length_k": 5}
    q, k, v = make_qkv(1, 4, 2, s, 16, torch.bfloat16, seed=31)
    out, _ = kernel(version)(Attn(), q, k, v, None, **kwargs)
    ref, _ = eager_attention(Attn().eval(), q.double(), k.double(), v.double(), None, **kwargs)
    torch.testing.assert_close(out.double(), ref, atol=8e-3, rtol=8e-3)
