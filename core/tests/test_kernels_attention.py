"""attention kernels (eager, sdpa, flex_attention): transformers' own functions with the masks transformers
builds, float64 reference forward and backward (GQA, causal, padding, window, softcap),
dropout, errors."""

import pytest
import torch
from veomni_ops.backends import reference
from veomni_ops.kernels.attention import eager_attention, sdpa_attention

KERNELS = {"eager": eager_attention, "sdpa": sdpa_attention}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


class Attn(torch.nn.Module):
    """The attributes transformers' attention functions read from the module."""

    def __init__(self, hq, hk, d, causal=True):
        super().__init__()
        self.num_key_value_groups = hq // hk
        self.head_dim = d
        self.is_causal = causal


def spec(name):
    return next(s for s in reference.attention() if s.name == name)


def qkv(b, hq, hk, s, d, dtype, seed, sk=None):
    g = torch.Generator().manual_seed(seed)
    sk = sk or s
    q = torch.randn(b, hq, s, d, generator=g).to(dtype).requires_grad_()
    k = torch.randn(b, hk, sk, d, generator=g).to(dtype).requires_grad_()
    v = torch.randn(b, hk, sk, d, generator=g).to(dtype).requires_grad_()
    return q, k, v


def hf_masks(impl, b, s, padding=None, sliding_window=None, position_ids=None):
    from transformers import Qwen3Config
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    cfg = Qwen3Config(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                      sliding_window=sliding_window, use_sliding_window=sliding_window is not None)
    cfg._attn_implementation = impl
    fn = create_sliding_window_causal_mask if sliding_window else create_causal_mask
    if position_ids is None:
        position_ids = torch.arange(s)[None].expand(b, s)
    return fn(config=cfg, inputs_embeds=torch.zeros(b, s, 16), attention_mask=padding,
              past_key_values=None, position_ids=position_ids)


def allowed(b, s, sk, causal, padding=None, window=None, segments=None):
    """Boolean [B, 1, S, Sk] of what each query may see, from first principles."""
    qp = torch.arange(sk - s, sk)[:, None]
    kp = torch.arange(sk)[None]
    ok = torch.ones(s, sk, dtype=torch.bool)
    if causal:
        ok &= kp <= qp
    if window is not None:
        ok &= kp > qp - window
    ok = ok[None, None].expand(b, 1, s, sk).clone()
    if padding is not None:
        ok &= padding.bool()[:, None, None, :]
    if segments is not None:
        ok &= segments[:, None, :, None] == segments[:, None, None, :]
    return ok


def ref64(q, k, v, ok, scaling, softcap=None):
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = q @ k.transpose(-1, -2) * scaling
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~ok, float("-inf"))
    return (torch.softmax(scores, -1) @ v).transpose(1, 2)


MASK_CASES = ["causal_none", "causal_padding", "sliding_window", "packed"]


def case_inputs(case, impl, b, s):
    padding = window = segments = position_ids = None
    if case == "causal_padding":
        padding = torch.ones(b, s, dtype=torch.long)
        padding[0, :3] = 0  # left padding
        padding[-1, -2:] = 0  # right padding
    if case == "sliding_window":
        window = 3
    if case == "packed":
        position_ids = torch.tensor([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 0, 1]])[:b, :s]
        segments = torch.cumsum(position_ids == 0, dim=1)
    mask = hf_masks(impl, b, s, padding, window, position_ids)
    ok = allowed(b, s, s, True, padding, window, segments)
    return mask, ok, window


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", MASK_CASES)
def test_vs_float64(kernel, dtype, case):
    b, hq, hk, s, d = 2, 4, 2, 7, 8
    q, k, v = qkv(b, hq, hk, s, d, dtype, seed=len(case))
    mask, ok, window = case_inputs(case, kernel, b, s)
    if case == "causal_none":
        assert mask is None or kernel == "eager"
    out, weights = KERNELS[kernel](Attn(hq, hk, d), q, k, v, mask, scaling=d**-0.5, sliding_window=window)
    assert out.shape == (b, s, hq, d) and out.dtype == dtype
    assert (weights is None) == (kernel == "sdpa")
    gy = torch.randn(b, s, hq, d).to(dtype)
    rows = ok.any(-1).squeeze(1)  # queries that see at least one key (others are padding)
    gy = gy * rows[:, :, None, None]
    grads = torch.autograd.grad(out, (q, k, v), gy)
    ins64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    # Fully masked (padding) queries: let the reference see everything there, and give them no gradient.
    out64 = ref64(*ins64, ok | ~rows[:, None, :, None], d**-0.5) * rows[:, :, None, None]
    grads64 = torch.autograd.grad(out64, ins64, gy.double())
    tol = spec(kernel).tolerance(str(dtype))
    torch.testing.assert_close((out * rows[:, :, None, None]).double(), out64, rtol=tol.rtol, atol=tol.atol)
    for what, g, g64 in zip("qkv", grads, grads64):
        torch.testing.assert_close(g.double(), g64, rtol=tol.rtol, atol=tol.atol, msg=f"grad {what}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", MASK_CASES)
def test_equal_to_transformers(dtype, case):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

    b, hq, hk, s, d = 2, 4, 2, 7, 8
    q, k, v = qkv(b, hq, hk, s, d, dtype, seed=3)
    mod = Attn(hq, hk, d).eval()
    for impl, ours, theirs in (("eager", eager_attention, eager_attention_forward),
                               ("sdpa", sdpa_attention, sdpa_attention_forward)):
        mask, _, window = case_inputs(case, impl, b, s)
        a_out, a_w = ours(mod, q, k, v, mask, dropout=0.0, scaling=d**-0.5, sliding_window=window)
        b_out, b_w = theirs(mod, q, k, v, mask, dropout=0.0, scaling=d**-0.5, sliding_window=window)
        assert torch.equal(a_out, b_out), impl
        if impl == "eager":
            assert torch.equal(a_w, b_w)
        g = torch.randn_like(a_out)
        ga = torch.autograd.grad(a_out, (q, k, v), g)
        gb = torch.autograd.grad(b_out, (q, k, v), g)
        for x, y in zip(ga, gb):
            assert torch.equal(x, y), impl


def test_softcap_eager_matches_gemma2_and_float64_and_sdpa_refuses():
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager

    b, hq, hk, s, d = 1, 2, 1, 6, 8
    q, k, v = qkv(b, hq, hk, s, d, torch.float32, seed=4)
    q = (q * 6).detach().requires_grad_()  # large scores, so the cap matters
    mask = hf_masks("eager", b, s)
    mod = Attn(hq, hk, d).eval()
    ours, w = eager_attention(mod, q, k, v, mask, softcap=5.0)
    theirs, w2 = gemma2_eager(mod, q, k, v, mask, softcap=5.0)
    assert torch.equal(ours, theirs) and torch.equal(w, w2)
    ref = ref64(q, k, v, allowed(b, s, s, True), d**-0.5, softcap=5.0)
    torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours.double(), ref64(q, k, v, allowed(b, s, s, True), d**-0.5), atol=1e-3)
    with pytest.raises(ValueError, match="attn_implementation: eager"):
        sdpa_attention(mod, q, k, v, None, softcap=5.0)


def test_causal_without_mask_and_non_causal():
    b, hq, hk, s, d = 2, 4, 1, 5, 8
    q, k, v = qkv(b, hq, hk, s, d, torch.float64, seed=5)
    for kernel in KERNELS.values():
        out, _ = kernel(Attn(hq, hk, d), q, k, v, None)
        torch.testing.assert_close(out, ref64(q, k, v, allowed(b, s, s, True), d**-0.5))
        out, _ = kernel(Attn(hq, hk, d, causal=False), q, k, v, None)
        torch.testing.assert_close(out, ref64(q, k, v, allowed(b, s, s, False), d**-0.5))
        out, _ = kernel(Attn(hq, hk, d), q, k, v, None, is_causal=False)  # kwarg wins over the module
        torch.testing.assert_close(out, ref64(q, k, v, allowed(b, s, s, False), d**-0.5))
        out, _ = kernel(Attn(hq, hk, d), q, k, v, None, sliding_window=2)  # no mask: the window still holds
        torch.testing.assert_close(out, ref64(q, k, v, allowed(b, s, s, True, window=2), d**-0.5))
        out, _ = kernel(Attn(hq, hk, d), q, k, v, None, sliding_window=8)  # window longer than the sequence
        torch.testing.assert_close(out, ref64(q, k, v, allowed(b, s, s, True), d**-0.5))


def test_decode_step_and_boolean_mask_in_eager():
    b, hq, hk, d = 2, 2, 2, 8
    q, k, v = qkv(b, hq, hk, 1, d, torch.float64, seed=6, sk=6)
    ok = torch.ones(b, 1, 1, 6, dtype=torch.bool)
    ok[1, ..., :2] = False
    for kernel in KERNELS.values():
        out, _ = kernel(Attn(hq, hk, d), q, k, v, ok)
        torch.testing.assert_close(out, ref64(q, k, v, ok, d**-0.5))
        out, _ = kernel(Attn(hq, hk, d), q, k, v, None)  # one query sees all cached keys
        torch.testing.assert_close(out, ref64(q, k, v, torch.ones_like(ok), d**-0.5))


def test_non_contiguous_inputs():
    b, hq, hk, s, d = 2, 4, 2, 6, 8
    q = torch.randn(b, s, hq, d).transpose(1, 2)  # as the projections give them
    k = torch.randn(b, s, hk, d).transpose(1, 2)
    v = torch.randn(b, s, hk, d).transpose(1, 2)
    mask = hf_masks("eager", b, s)
    for name, kernel in KERNELS.items():
        m = mask if name == "eager" else None
        a, _ = kernel(Attn(hq, hk, d), q, k, v, m)
        c, _ = kernel(Attn(hq, hk, d), q.contiguous(), k.contiguous(), v.contiguous(), m)
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-6)


def test_dropout_follows_transformers():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

    b, hq, hk, s, d = 1, 2, 1, 8, 8
    q, k, v = qkv(b, hq, hk, s, d, torch.float32, seed=7)
    mask = hf_masks("eager", b, s)
    mod = Attn(hq, hk, d).train()
    torch.manual_seed(0)
    a, wa = eager_attention(mod, q, k, v, mask, dropout=0.5, scaling=d**-0.5)
    torch.manual_seed(0)
    c, wc = eager_attention_forward(mod, q, k, v, mask, dropout=0.5, scaling=d**-0.5)
    assert torch.equal(a, c) and torch.equal(wa, wc)
    no_drop, _ = eager_attention(mod, q, k, v, mask, scaling=d**-0.5)
    assert not torch.allclose(a, no_drop)  # dropout was applied
    mod.eval()  # eager drops only in training, as transformers
    torch.testing.assert_close(eager_attention(mod, q, k, v, mask, dropout=0.5, scaling=d**-0.5)[0], no_drop)
    mod.train()
    torch.manual_seed(1)
    a, _ = sdpa_attention(mod, q, k, v, None, dropout=0.5)
    torch.manual_seed(1)
    c, _ = sdpa_attention_forward(mod, q, k, v, None, dropout=0.5)
    assert torch.equal(a, c)


def test_gradcheck_eager_float64():
    b, hq, hk, s, d = 1, 2, 1, 4, 3
    q, k, v = qkv(b, hq, hk, s, d, torch.float64, seed=8)
    mask = hf_masks("eager", b, s).double()
    mod = Attn(hq, hk, d)
    assert torch.autograd.gradcheck(lambda a, b_, c: eager_attention(mod, a, b_, c, mask)[0], (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b_, c: sdpa_attention(mod, a, b_, c, None)[0], (q, k, v))


def test_errors():
    q, k, v = qkv(1, 3, 2, 4, 8, torch.float32, seed=9)
    mod = Attn(4, 2, 8)
    for kernel in KERNELS.values():
        with pytest.raises(ValueError, match="not a multiple"):
            kernel(mod, q, k, v, None)
        q4 = torch.randn(1, 4, 4, 8)
        with pytest.raises(ValueError, match="4-D mask"):
            kernel(mod, q4, k, v, torch.ones(1, 4, dtype=torch.bool))
        with pytest.raises(ValueError, match="4-D"):
            kernel(mod, q4[0], k, v, None)
        with pytest.raises(TypeError, match="dtypes differ"):
            kernel(mod, q4.double(), k, v, None)
        with pytest.raises(ValueError, match="sinks"):
            # sdpa has no sinks at all; eager has them, [H] per head (4 here, not 3)
            kernel(mod, q4, k, v, None, s_aux=torch.zeros(4 if kernel is sdpa_attention else 3))
        with pytest.raises(TypeError, match="boolean"):
            kernel(mod, q4, k, v, torch.ones(1, 1, 4, 4, dtype=torch.long))


def _sinks_reference(q, k, v, mask, sinks, scaling):
    """GPT-OSS's attention with sinks, in float64: one extra logit per head joins each row's softmax."""
    n_rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(n_rep, 1)
    v = v.repeat_interleave(n_rep, 1)
    s = (q @ k.transpose(2, 3)) * scaling + mask
    b, h, sq, _ = s.shape
    col = sinks.reshape(1, h, 1, 1).expand(b, h, sq, 1)
    p = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]
    return (p @ v).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_attention_sinks_match_float64(dtype):
    q, k, v = qkv(2, 4, 2, 5, 8, dtype, seed=3)
    mod = Attn(4, 2, 8)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(4)).to(dtype).requires_grad_()
    causal = torch.full((5, 5), float("-inf")).triu(1)[None, None]
    for t in (q, k, v):
        t.requires_grad_()
    out, _ = eager_attention(mod, q, k, v, causal.to(dtype), scaling=0.3, s_aux=sinks)
    d64 = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    ref = _sinks_reference(*d64[:3], causal.double(), d64[3], 0.3)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(out.double(), ref, **tol)
    g = torch.randn_like(ref)
    out.backward(g.to(dtype))
    ref.backward(g)
    for got, want in zip((q, k, v, sinks), d64):
        torch.testing.assert_close(got.grad.double(), want.grad, **tol)
    # sinks take probability mass: with a huge sink logit the output goes to zero
    big, _ = eager_attention(mod, q.detach(), k.detach(), v.detach(), causal.to(dtype), scaling=0.3,
                             s_aux=torch.full((4,), 30.0, dtype=dtype))
    assert big.abs().max() < 1e-6


# --- packing arguments: honoured (as a block-diagonal mask) or refused, never ignored ------
PACKED_POS = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0, 1]])  # documents of 3, 4 and 2 tokens in one row
PACKED_CU = torch.tensor([0, 3, 7, 9], dtype=torch.int32)


def _check_packed(kernel, out, q, k, v, ok, dtype):
    gy = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), gy)
    ins64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out64 = ref64(*ins64, ok, q.shape[-1] ** -0.5)
    grads64 = torch.autograd.grad(out64, ins64, gy.double())
    tol = spec(kernel).tolerance(str(dtype))
    torch.testing.assert_close(out.double(), out64, rtol=tol.rtol, atol=tol.atol)
    for what, g, g64 in zip("qkv", grads, grads64):
        torch.testing.assert_close(g.double(), g64, rtol=tol.rtol, atol=tol.atol, msg=f"grad {what}")


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("form", ["cu_seq_lens", "cu_seq_lens+max_length", "position_ids", "cu+4d-mask"])
def test_packed_sequences_are_honoured(kernel, dtype, form):
    hq, hk, s, d = 4, 2, 9, 8
    q, k, v = qkv(1, hq, hk, s, d, dtype, seed=11)
    segments = torch.cumsum(PACKED_POS == 0, dim=1)
    ok = allowed(1, s, s, True, segments=segments)
    mask, kw = None, {}
    if form.startswith("cu"):
        kw = {"cu_seq_lens_q": PACKED_CU, "cu_seq_lens_k": PACKED_CU}
        if form.endswith("max_length"):
            kw.update(max_length_q=4, max_length_k=4)
    if form == "cu+4d-mask":
        # a causal mask that does not know the packing: the kernel ANDs the documents into it
        mask = torch.ones(s, s, dtype=torch.bool).tril()[None, None]
    if form == "position_ids":
        kw = {"position_ids": PACKED_POS}
    out, _ = KERNELS[kernel](Attn(hq, hk, d), q, k, v, mask, scaling=d**-0.5, **kw)
    _check_packed(kernel, out, q, k, v, ok, dtype)


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_packed_position_ids_per_row_with_a_window_and_cache_of_the_restart_check(kernel, monkeypatch):
    from veomni_ops.ops.attention import packing as A  # where the kernels look it up

    b, hq, hk, s, d = 2, 2, 1, 7, 8
    q, k, v = qkv(b, hq, hk, s, d, torch.float32, seed=5)
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 0, 1]])
    segments = torch.cumsum(pos == 0, dim=1)
    ok = allowed(b, s, s, True, window=2, segments=segments)
    calls = []
    real = A._restarts
    monkeypatch.setattr(A, "_restarts", lambda p: calls.append(1) or real(p))
    out, _ = KERNELS[kernel](Attn(hq, hk, d), q, k, v, None, scaling=d**-0.5, sliding_window=2, position_ids=pos)
    _check_packed(kernel, out, q, k, v, ok, torch.float32)
    # unpacked position ids (one document per row) change nothing: same result as without them
    plain = torch.arange(s)[None].expand(b, s)
    got, _ = KERNELS[kernel](Attn(hq, hk, d), q, k, v, None, scaling=d**-0.5, position_ids=plain)
    want, _ = KERNELS[kernel](Attn(hq, hk, d), q, k, v, None, scaling=d**-0.5)
    assert torch.equal(got, want)
    # the restart check runs once per position_ids tensor (the layers of a forward share it)
    n = len(A._RESTARTS)
    KERNELS[kernel](Attn(hq, hk, d), q, k, v, None, scaling=d**-0.5, position_ids=plain)
    assert len(A._RESTARTS) == n and len(calls) == 3
    # multimodal [3, B, S] positions carry no packing
    got, _ = KERNELS[kernel](Attn(hq, hk, d), q, k, v, None, scaling=d**-0.5, position_ids=plain[None].expand(3, b, s))
    assert torch.equal(got, want)


def test_restart_check_is_cached_per_tensor_and_version():
    from veomni_ops.ops.attention.kernel import _restarts

    pos = torch.arange(6)[None].clone()
    assert _restarts(pos) is False
    pos[0, 3] = 0  # in place: a new version, checked again
    assert _restarts(pos) is True
    assert _restarts(torch.tensor([[0, 1, 0]])) is True


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("kw, match", [
    ({"max_length_q": 4}, r"max_length_q is given without cu_seq_lens_q.*flash_attention_2/3/4"),
    ({"max_length_k": 4, "cu_seq_lens_q": PACKED_CU}, r"max_length_k is given without cu_seq_lens_k"),
    ({"cu_seq_lens_q": PACKED_CU}, r"cu_seq_lens_q is given without cu_seq_lens_k.*flash_attention_2/3/4"),
    ({"cu_seq_lens_q": PACKED_CU, "cu_seq_lens_k": torch.tensor([0, 3, 9])}, r"3 documents, cu_seq_lens_k 2"),
    ({"cu_seq_lens_q": torch.tensor([0, 3, 8]), "cu_seq_lens_k": PACKED_CU}, r"cu_seq_lens_q = \[0, 3, 8\].*end at"),
    ({"cu_seq_lens_q": PACKED_CU.float(), "cu_seq_lens_k": PACKED_CU}, r"cu_seq_lens_q has dtype torch.float32"),
])
def test_packing_arguments_refused_name_the_argument(kernel, kw, match):
    q, k, v = qkv(1, 2, 1, 9, 8, torch.float32, seed=1)
    with pytest.raises((ValueError, TypeError), match=match):
        KERNELS[kernel](Attn(2, 1, 8), q, k, v, None, scaling=8**-0.5, **kw)


def test_cu_seq_lens_need_a_batch_of_one_row():
    q, k, v = qkv(2, 2, 1, 9, 8, torch.float32, seed=1)
    for fn in KERNELS.values():
        with pytest.raises(ValueError, match=r"cu_seq_lens_q/k describe a packed batch of one row.*batch size 2"):
            fn(Attn(2, 1, 8), q, k, v, None, cu_seq_lens_q=PACKED_CU, cu_seq_lens_k=PACKED_CU)


# --- sdpa's packed rows through torch's varlen kernel (CUDA) -------------------------------
def _varlen_stand_in(calls, gqa: bool):
    """A stand-in for torch.nn.attention.varlen.varlen_attn on the CPU: each document of the
    flattened [T, H, D] tokens attends to itself (causal per the window), in float64. With
    ``gqa`` it has torch 2.13's keywords (enable_gqa, window_size); without, only is_causal (key
    and value heads repeated by the caller)."""
    def attend(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, causal=True):
        assert q.dim() == 3 and cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k)
        calls.append((cu_q.tolist(), max_q, max_k))
        out = []
        cu = cu_q.tolist()
        for a, b in zip(cu, cu[1:]):
            qq, kk, vv = (t[a:b].transpose(0, 1)[None] for t in (q, k, v))
            ok = allowed(1, b - a, b - a, causal)
            out.append(ref64(qq, kk, vv, ok, scale if scale is not None else q.shape[-1] ** -0.5)[0].to(q.dtype))
        return torch.cat(out)

    if gqa:
        def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
            assert enable_gqa == (k.shape[1] != q.shape[1])
            return attend(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, causal=window_size == (-1, 0))
    else:
        def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, is_causal=False):
            assert k.shape[1] == q.shape[1]
            return attend(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, causal=is_causal)
    return varlen_attn


@pytest.mark.parametrize("gqa", [True, False], ids=["enable_gqa", "repeated_kv"])
@pytest.mark.parametrize("form", ["position_ids", "position_ids-per-row", "cu_seq_lens"])
def test_sdpa_gives_packed_rows_to_the_varlen_kernel(monkeypatch, gqa, form):
    """Where torch's varlen kernel runs (CUDA, half precision), sdpa gives it a packed row's
    documents (cumulative lengths over the flattened batch) instead of building the [S, S]
    mask; on the CPU a stand-in takes its place, so what sdpa passes (lengths, longest, layout,
    GQA, causality, scale) is checked against float64, forward and backward."""
    from veomni_ops.ops.attention import varlen as A  # where the kernels look it up

    calls: list = []
    monkeypatch.setattr(A, "_varlen_usable", lambda q: True)
    monkeypatch.setattr(A, "_varlen_kernel", lambda: _varlen_stand_in(calls, gqa))
    b, hq, hk, s, d = (2, 4, 2, 7, 8) if form == "position_ids-per-row" else (1, 4, 2, 9, 8)
    q, k, v = qkv(b, hq, hk, s, d, torch.bfloat16, seed=3)
    if form == "position_ids-per-row":
        pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 0, 1]])
        kw, want_cu, longest = {"position_ids": pos}, [0, 3, 7, 12, 14], 5
    elif form == "position_ids":
        pos = PACKED_POS
        kw, want_cu, longest = {"position_ids": pos}, [0, 3, 7, 9], 4
    else:
        pos = PACKED_POS
        kw, want_cu, longest = {"cu_seq_lens_q": PACKED_CU, "cu_seq_lens_k": PACKED_CU}, [0, 3, 7, 9], 4
    out, _ = sdpa_attention(Attn(hq, hk, d), q, k, v, None, scaling=d**-0.5, **kw)
    assert calls == [(want_cu, longest, longest)]
    assert out.shape == (b, s, hq, d) and out.is_contiguous()
    _check_packed("sdpa", out, q, k, v, allowed(b, s, s, True, segments=torch.cumsum(pos == 0, dim=1)),
                  torch.bfloat16)


def test_sdpa_keeps_the_mask_where_the_varlen_kernel_does_not_apply(monkeypatch):
    """A mask given, a window, dropout, a row of one document, or a CPU tensor: no varlen call."""
    from veomni_ops.ops.attention import varlen as A  # where the kernels look it up

    calls: list = []
    monkeypatch.setattr(A, "_varlen_kernel", lambda: _varlen_stand_in(calls, True))
    q, k, v = qkv(1, 4, 2, 9, 8, torch.bfloat16, seed=4)
    mod = Attn(4, 2, 8)
    sdpa_attention(mod, q, k, v, None, position_ids=PACKED_POS)  # the CPU: the kernel does not run here
    assert not calls and A._varlen_usable(q) is False
    monkeypatch.setattr(A, "_varlen_usable", lambda q: True)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()[None, None]
    sdpa_attention(mod, q, k, v, causal, position_ids=PACKED_POS)
    sdpa_attention(mod, q, k, v, None, sliding_window=2, position_ids=PACKED_POS)
    sdpa_attention(mod, q, k, v, None, dropout=0.1, position_ids=PACKED_POS)
    sdpa_attention(mod, q, k, v, None, position_ids=torch.arange(9)[None])
    assert not calls
    sdpa_attention(mod, q, k, v, None, position_ids=PACKED_POS)
    assert len(calls) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch's varlen kernel runs on CUDA GPUs")
def test_sdpa_packed_rows_on_cuda_use_the_varlen_kernel_and_match_float64():
    """On a CUDA GPU (capability >= 8.0): the real kernel, a 2,048-token row of 5 documents."""
    from veomni_ops.ops.attention import varlen as A  # where the kernels look it up

    if not A._varlen_usable(torch.empty(1, device="cuda", dtype=torch.bfloat16)):
        pytest.fail(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: sdpa's varlen path cannot run")
    lengths = [700, 300, 512, 36, 500]
    pos = torch.cat([torch.arange(n) for n in lengths])[None].cuda()
    s, hq, hk, d = sum(lengths), 8, 2, 128
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, h, s, d, generator=g).to("cuda", torch.bfloat16).requires_grad_()
               for h in (hq, hk, hk))
    real, used = A._varlen_kernel(), []
    A._varlen_kernel.cache_clear()
    try:
        import unittest.mock

        with unittest.mock.patch.object(A, "_varlen_kernel", lambda: (used.append(1), real)[1]):
            out, _ = sdpa_attention(Attn(hq, hk, d), q, k, v, None, scaling=d**-0.5, position_ids=pos)
    finally:
        A._varlen_kernel.cache_clear()
    assert used
    segments = torch.cumsum(pos.cpu() == 0, dim=1)
    _check_packed("sdpa", out, q, k, v, allowed(1, s, s, True, segments=segments).cuda(), torch.bfloat16)


# --- flex_attention: PyTorch's FlexAttention under the same contract ----------------------
# PyTorch's FlexAttention has no backward on the CPU: there the kernel is checked forward only
# (inputs without gradients); on a CUDA GPU forward and backward, eager (its compiled FlexAttention)
# and under torch.compile.
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


def flex_qkv(device, b, hq, hk, s, d, dtype, seed, sk=None):
    grad = device == "cuda"
    return [t.detach().to(device).requires_grad_(grad) for t in qkv(b, hq, hk, s, d, dtype, seed, sk)]


def check_flex(out, q, k, v, ok, scaling, softcap=None, rows=None):
    """``out`` of flex_attention against the float64 reference; its gradients too where it has them."""
    tol = spec("flex_attention").tolerance(str(q.dtype))
    keep = torch.ones(ok.shape[0], ok.shape[2], dtype=torch.bool) if rows is None else rows
    keep = keep.to(out.device)[:, :, None, None]
    ins64 = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    ok = ok | ~keep.cpu().squeeze(-1).squeeze(-1)[:, None, :, None]  # fully masked rows: not compared
    out64 = ref64(*ins64, ok, scaling, softcap=softcap) * keep.cpu()
    torch.testing.assert_close((out * keep).cpu().double(), out64, rtol=tol.rtol, atol=tol.atol)
    if not q.requires_grad:
        return
    gy = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)) * keep.cpu()
    grads = torch.autograd.grad(out, (q, k, v), gy.to(out.device, out.dtype))
    grads64 = torch.autograd.grad(out64, ins64, gy.double())
    for what, g, g64 in zip("qkv", grads, grads64):
        torch.testing.assert_close(g.cpu().double(), g64, rtol=tol.rtol, atol=tol.atol, msg=f"grad {what}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["flex_attention", "sdpa", "eager"])
@pytest.mark.parametrize("case", MASK_CASES)
def test_flex_vs_float64(device, form, case):
    """The masks transformers builds for each implementation: a BlockMask (flex_attention), a
    boolean 4-D mask or None (sdpa), an additive 4-D mask (eager)."""
    from veomni_ops.kernels.attention import flex_attention_kernel

    b, hq, hk, s, d = 2, 4, 2, 7, (8 if device != "cuda" else 16)  # compiled FlexAttention on CUDA: head dim >= 16
    mask, ok, window = case_inputs(case, form, b, s)
    if device == "cuda" and mask is not None:
        mask = mask.to(device)
    rows = ok.any(-1).squeeze(1)
    for dtype in DTYPES:
        q, k, v = flex_qkv(device, b, hq, hk, s, d, dtype, seed=len(case))
        out, weights = flex_attention_kernel(Attn(hq, hk, d), q, k, v, mask, scaling=d**-0.5, sliding_window=window)
        assert weights is None and out.shape == (b, s, hq, d) and out.dtype == dtype
        check_flex(out, q, k, v, ok, d**-0.5, rows=rows)


@pytest.mark.parametrize("device", DEVICES)
def test_flex_softcap_vs_float64(device):
    from veomni_ops.kernels.attention import flex_attention_kernel

    b, hq, hk, s, d = 1, 2, 1, 6, (8 if device != "cuda" else 16)  # compiled FlexAttention on CUDA: head dim >= 16
    for dtype in DTYPES:
        q, k, v = flex_qkv(device, b, hq, hk, s, d, dtype, seed=4)
        q = (q.detach() * 6).requires_grad_(q.requires_grad)  # large scores, so the cap matters
        out, _ = flex_attention_kernel(Attn(hq, hk, d), q, k, v, None, softcap=5.0)
        check_flex(out, q, k, v, allowed(b, s, s, True), d**-0.5, softcap=5.0)
        uncapped = ref64(q.detach().cpu(), k.detach().cpu(), v.detach().cpu(), allowed(b, s, s, True), d**-0.5)
        assert not torch.allclose(out.detach().cpu().double(), uncapped, atol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_flex_causality_window_and_decode_without_a_mask(device):
    from veomni_ops.kernels.attention import flex_attention_kernel as flex

    b, hq, hk, s, d = 2, 4, 1, 5, (8 if device != "cuda" else 16)  # compiled FlexAttention on CUDA: head dim >= 16
    dtype = torch.float64 if device == "cpu" else torch.float32
    q, k, v = flex_qkv(device, b, hq, hk, s, d, dtype, seed=5)
    check_flex(flex(Attn(hq, hk, d), q, k, v, None)[0], q, k, v, allowed(b, s, s, True), d**-0.5)
    check_flex(flex(Attn(hq, hk, d, causal=False), q, k, v, None)[0], q, k, v, allowed(b, s, s, False), d**-0.5)
    check_flex(flex(Attn(hq, hk, d), q, k, v, None, is_causal=False)[0], q, k, v, allowed(b, s, s, False), d**-0.5)
    check_flex(flex(Attn(hq, hk, d), q, k, v, None, sliding_window=2)[0], q, k, v,
               allowed(b, s, s, True, window=2), d**-0.5)
    check_flex(flex(Attn(hq, hk, d), q, k, v, None, sliding_window=8)[0], q, k, v, allowed(b, s, s, True), d**-0.5)
    # one query over six cached keys: sees them all, or what a boolean mask allows
    q1, k6, v6 = flex_qkv(device, b, hq, hk, 1, d, dtype, seed=6, sk=6)
    check_flex(flex(Attn(hq, hk, d), q1, k6, v6, None)[0], q1, k6, v6, torch.ones(b, 1, 1, 6, dtype=torch.bool),
               d**-0.5)
    ok = torch.ones(b, 1, 1, 6, dtype=torch.bool)
    ok[1, ..., :2] = False
    check_flex(flex(Attn(hq, hk, d), q1, k6, v6, ok.to(device))[0], q1, k6, v6, ok, d**-0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["cu_seq_lens", "position_ids", "cu+4d-mask"])
def test_flex_packed_sequences_are_honoured(device, form):
    from veomni_ops.kernels.attention import flex_attention_kernel

    hq, hk, s, d = 4, 2, 9, (8 if device != "cuda" else 16)  # compiled FlexAttention on CUDA: head dim >= 16
    q, k, v = flex_qkv(device, 1, hq, hk, s, d, torch.float32, seed=11)
    ok = allowed(1, s, s, True, segments=torch.cumsum(PACKED_POS == 0, dim=1))
    mask, kw = None, {"position_ids": PACKED_POS.to(device)}
    if form != "position_ids":
        kw = {"cu_seq_lens_q": PACKED_CU.to(device), "cu_seq_lens_k": PACKED_CU.to(device)}
    if form == "cu+4d-mask":
        mask = torch.ones(s, s, dtype=torch.bool, device=device).tril()[None, None]
    out, _ = flex_attention_kernel(Attn(hq, hk, d), q, k, v, mask, scaling=d**-0.5, **kw)
    check_flex(out, q, k, v, ok, d**-0.5)


def test_flex_refuses_what_it_cannot_honour():
    from torch.nn.attention.flex_attention import create_block_mask
    from veomni_ops.kernels.attention import flex_attention_kernel as flex

    q, k, v = flex_qkv("cpu", 1, 4, 2, 6, 8, torch.float32, seed=9)
    mod = Attn(4, 2, 8)
    with pytest.raises(ValueError, match="dropout=0.1 cannot be honoured"):
        flex(mod, q, k, v, None, dropout=0.1)
    with pytest.raises(ValueError, match="sinks"):
        flex(mod, q, k, v, None, s_aux=torch.zeros(4))
    with pytest.raises(ValueError, match="position_bias"):
        flex(mod, q, k, v, None, position_bias=torch.zeros(1))
    with pytest.raises(ValueError, match=r"BlockMask is for \(queries, keys\) = \(5, 5\), the call has \(6, 6\)"):
        flex(mod, q, k, v, create_block_mask(lambda b, h, i, j: j <= i, None, None, 5, 5, device="cpu"))
    with pytest.raises(ValueError, match="not a multiple"):
        flex(mod, q[:, :3], k, v, None)
    with pytest.raises(ValueError, match="4-D mask"):
        flex(mod, q, k, v, torch.ones(1, 6, dtype=torch.bool))


def test_flex_spec_declares_what_it_honours():
    s = spec("flex_attention")
    assert set(s.features) == {"softcap", "sliding_window"}  # no dropout, no sinks
    assert s.parallel == () and s.supports_backward and s.supports_compile
    assert s.hardware.device_types == ("cuda",)  # FlexAttention has no backward on the CPU
    assert s.priority < spec("eager").priority  # never auto's choice: named only


def test_flex_traces_fullgraph_on_the_cpu_forward():
    """No graph break in what the kernel builds around FlexAttention (masks from packing, the
    window, soft-capping): dynamo and AOTAutograd trace the forward whole (the CPU has no backward)."""
    from veomni_ops.kernels.attention import flex_attention_kernel

    b, hq, hk, s, d = 2, 4, 2, 24, 8
    q, k, v = flex_qkv("cpu", b, hq, hk, s, d, torch.float32, seed=13)
    pos = torch.tensor([list(range(10)) + list(range(14)), list(range(24))])
    mod = Attn(hq, hk, d)

    def run(q, k, v, pos):
        return flex_attention_kernel(mod, q, k, v, None, sliding_window=6, softcap=20.0, position_ids=pos)[0]

    torch._dynamo.reset()
    got = torch.compile(run, fullgraph=True, backend="aot_eager")(q, k, v, pos)
    torch.testing.assert_close(got, run(q, k, v, pos))
    segments = torch.cumsum(pos == 0, dim=1)
    check_flex(got, q, k, v, allowed(b, s, s, True, window=6, segments=segments), d**-0.5, softcap=20.0)


@CUDA
def test_flex_compiles_fullgraph_forward_and_backward():
    """Under torch.compile (inductor: FlexAttention's fused Triton kernel) as without it, against float64."""
    from veomni_ops.kernels.attention import flex_attention_kernel

    b, hq, hk, s, d = 2, 4, 2, 128, 64
    mod = Attn(hq, hk, d)
    compiled = torch.compile(lambda q, k, v: flex_attention_kernel(mod, q, k, v, None, sliding_window=48,
                                                                  softcap=20.0)[0], fullgraph=True)
    for dtype in DTYPES:
        q, k, v = flex_qkv("cuda", b, hq, hk, s, d, dtype, seed=12)
        check_flex(compiled(q, k, v), q, k, v, allowed(b, s, s, True, window=48), d**-0.5, softcap=20.0)


def test_flex_refuses_a_head_dim_cuda_cannot_lower():
    from veomni_ops.kernels.attention import flex_head_dim_problem

    assert "head dim 8 < 16" in flex_head_dim_problem("cuda", 8) and "sdpa or eager" in flex_head_dim_problem("cuda", 8)
    assert flex_head_dim_problem("cuda", 16) is None and flex_head_dim_problem("cpu", 8) is None
