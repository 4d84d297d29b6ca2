"""rotary eager kernel (full and partial): float64 reference, transformers bitwise, errors."""

import pytest
import torch
from veomni_ops.backends import reference
from veomni_ops.kernels.rotary import apply_rotary

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def spec(variant):
    return next(s for s in reference.rotary() if s.variant == variant and s.name == "eager")


def assert_within(actual, expected, tol, what):
    diff = (actual.double() - expected).abs()
    bad = diff > tol.atol + tol.rtol * expected.abs()
    assert not bad.any(), f"{what}: {int(bad.sum())}/{bad.numel()} outside {tol}; max |diff| {diff.max().item():.3g}"


def cos_sin(b, s, r, dtype, theta=10000.0):
    pos = torch.arange(s, dtype=torch.float64)[None].expand(b, s) + torch.arange(b)[:, None] * 3  # per-batch offsets
    inv = 1.0 / theta ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    freqs = pos[..., None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def ref64(x, cos, sin):
    """Rotation of channel pairs (i, i + R/2) by explicit angles: independent of rotate_half."""
    x, cos, sin = x.double(), cos.double()[:, None], sin.double()[:, None]
    r = cos.shape[-1]
    half = r // 2
    x1, x2, rest = x[..., :half], x[..., half:r], x[..., r:]
    c, s = cos[..., :half], sin[..., :half]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, rest), dim=-1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant,d,r", [("full", 64, 64), ("full", 6, 6), ("partial", 64, 16), ("partial", 10, 4)])
def test_forward_backward_vs_float64(dtype, variant, d, r):
    torch.manual_seed(d * 31 + r)
    b, hq, hk, s = 2, 6, 2, 5
    q = torch.randn(b, hq, s, d).to(dtype).requires_grad_()
    k = torch.randn(b, hk, s, d).to(dtype).requires_grad_()
    cos, sin = cos_sin(b, s, r, dtype)
    qo, ko = apply_rotary(q, k, cos, sin)
    assert qo.dtype == dtype and qo.shape == q.shape and ko.shape == k.shape
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (gq, gk))

    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    qr, kr = ref64(q64, cos, sin), ref64(k64, cos, sin)
    dq64, dk64 = torch.autograd.grad((qr, kr), (q64, k64), (gq.double(), gk.double()))
    tol = spec(variant).tolerance(str(dtype))
    assert_within(qo, qr, tol, "q")
    assert_within(ko, kr, tol, "k")
    assert_within(dq, dq64, tol, "grad q")
    assert_within(dk, dk64, tol, "grad k")
    if r < d:  # pass-through channels are untouched, bit for bit
        assert torch.equal(qo[..., r:], q[..., r:])


def test_gradcheck_float64_partial():
    torch.manual_seed(0)
    q = torch.randn(1, 2, 3, 6, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 3, 6, dtype=torch.float64, requires_grad=True)
    cos, sin = cos_sin(1, 3, 4, torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: apply_rotary(a, b, cos, sin), (q, k))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bitwise_equal_to_transformers(dtype):
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb as full
    from transformers.models.qwen3_next.modeling_qwen3_next import apply_rotary_pos_emb as partial

    torch.manual_seed(3)
    q = torch.randn(2, 4, 7, 32).to(dtype)
    k = torch.randn(2, 2, 7, 32).to(dtype)
    for fn, r in ((full, 32), (partial, 8)):
        cos, sin = cos_sin(2, 7, r, dtype)
        a = fn(q, k, cos, sin)
        b = apply_rotary(q, k, cos, sin)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), fn.__module__


def test_non_contiguous_and_broadcast_batch():
    torch.manual_seed(4)
    # [B, S, H, D] projections transposed to [B, H, S, D]: the usual non-contiguous view.
    q = torch.randn(2, 5, 4, 16).transpose(1, 2)
    k = torch.randn(2, 5, 2, 16).transpose(1, 2)
    cos, sin = cos_sin(1, 5, 16, torch.float32)
    a = apply_rotary(q, k, cos, sin)
    b = apply_rotary(q.contiguous(), k.contiguous(), cos.expand(2, 5, 16), sin.expand(2, 5, 16))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_cos_dtype_follows_q():
    q = torch.randn(1, 2, 3, 8, dtype=torch.bfloat16)
    cos, sin = cos_sin(1, 3, 8, torch.float32)
    qo, ko = apply_rotary(q, q, cos, sin)
    assert qo.dtype == torch.bfloat16 and ko.dtype == torch.bfloat16


def test_errors():
    q = torch.randn(1, 2, 3, 8)
    cos, sin = cos_sin(1, 3, 8, torch.float32)
    with pytest.raises(ValueError, match="must be even"):
        apply_rotary(q, q, cos[..., :7], sin[..., :7])
    big_cos, big_sin = cos_sin(1, 3, 10, torch.float32)
    with pytest.raises(ValueError, match="at most the head dim 8"):
        apply_rotary(q, q, big_cos, big_sin)
    with pytest.raises(ValueError, match=r"4-D \[B, Hq, S, D\]"):
        apply_rotary(q[0], q, cos, sin)
    with pytest.raises(ValueError, match="same shape"):
        apply_rotary(q, q, cos, sin[..., :4])
    with pytest.raises(ValueError, match="do not fit"):
        apply_rotary(q, q, *cos_sin(1, 4, 8, torch.float32))
    with pytest.raises(TypeError, match="dtype torch.int64"):
        apply_rotary(q.long(), q, cos, sin)
