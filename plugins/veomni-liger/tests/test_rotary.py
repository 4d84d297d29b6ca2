"""The rotary adapters run Liger's real RoPE kernel (GPU, or the Triton interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch
from _helpers import BF16_ARITH_SKIP, assert_close, core_kernels, dtype_params, rope_cos_sin, rope_reference
from veomni_liger.kernels.rotary import SUPPORTS_PARTIAL, apply_rotary_full, apply_rotary_partial

# Liger's RoPE computes in the input dtype (no upcast).
DTYPES = dtype_params(bf16_arith=True)


def _qk(b, hq, hk, s, d, dtype, device, layout):
    if layout == "bshd":  # transformers: q_proj(x).view(B, S, H, D).transpose(1, 2)
        q = torch.randn(b, s, hq, d, device=device, dtype=dtype).transpose(1, 2)
        k = torch.randn(b, s, hk, d, device=device, dtype=dtype).transpose(1, 2)
    elif layout == "bhsd":
        q = torch.randn(b, hq, s, d, device=device, dtype=dtype)
        k = torch.randn(b, hk, s, d, device=device, dtype=dtype)
    else:  # a strided slice of a wider buffer: neither layout is contiguous
        q = torch.randn(b, hq, s, 2 * d, device=device, dtype=dtype)[..., ::2]
        k = torch.randn(b, hk, s, 2 * d, device=device, dtype=dtype)[..., ::2]
    return q.requires_grad_(), k.requires_grad_()


def _run(fn, q, k, cos, sin, variant):
    q_before, k_before = q.detach().clone(), k.detach().clone()
    oq, ok = fn(q, k, cos, sin)
    assert oq.shape == q.shape and ok.shape == k.shape
    assert oq.dtype == q.dtype and ok.dtype == k.dtype
    # The adapter never writes into the caller's q/k (Liger would, for the bshd layout).
    assert torch.equal(q.detach(), q_before) and torch.equal(k.detach(), k_before)

    rq, rk = rope_reference(q, k, cos, sin)
    assert_close(oq, rq, "rotary", variant, "q_embed")
    assert_close(ok, rk, "rotary", variant, "k_embed")

    gq = torch.randn_like(oq)  # randn_like keeps oq's [B, S, H, D] memory layout
    gk = torch.randn_like(ok)
    gq_before, gk_before = gq.clone(), gk.clone()
    torch.autograd.backward((oq, ok), (gq, gk))
    # Liger rotates the incoming gradient in place; the adapter hands it a private copy.
    assert torch.equal(gq, gq_before) and torch.equal(gk, gk_before)
    q64 = q.detach().double().requires_grad_()
    k64 = k.detach().double().requires_grad_()
    rq, rk = rope_reference_diff(q64, k64, cos.double(), sin.double())
    torch.autograd.backward((rq, rk), (gq.double(), gk.double()))
    assert_close(q.grad, q64.grad, "rotary", variant, "dq")
    assert_close(k.grad, k64.grad, "rotary", variant, "dk")
    return oq, ok


def rope_reference_diff(q, k, cos, sin):
    r = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]

    def rot(x):
        xr, xp = x[..., :r], x[..., r:]
        rh = torch.cat([-xr[..., r // 2:], xr[..., : r // 2]], dim=-1)
        return torch.cat([xr * cos + rh * sin, xp], dim=-1)

    return rot(q), rot(k)


@pytest.mark.parametrize(
    "dtype, layout",
    [
        (torch.float32, "bshd"),
        (torch.float16, "bshd"),
        pytest.param(torch.bfloat16, "bshd", marks=BF16_ARITH_SKIP),
        (torch.float32, "bhsd"),
        (torch.float16, "strided"),
    ],
    ids=str,
)
def test_full_forward_backward(device, dtype, layout):
    b, hq, hk, s, d = 2, 4, 2, 7, 32
    q, k = _qk(b, hq, hk, s, d, dtype, device, layout)
    cos, sin = rope_cos_sin(b, s, d, dtype, device)
    _run(apply_rotary_full, q, k, cos, sin, "full")


@pytest.mark.skipif(not SUPPORTS_PARTIAL, reason="installed liger-kernel has no rotary_dim (needs >= 0.8.5)")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d, r", [(24, 8), (32, 32)])
def test_partial_forward_backward_and_pass_through(device, dtype, d, r):
    # Odd head count (3 q heads), odd sequence; D = 24 is not a power of two.
    b, hq, hk, s = 2, 3, 1, 3
    q, k = _qk(b, hq, hk, s, d, dtype, device, "bshd")
    cos, sin = rope_cos_sin(b, s, r, dtype, device)
    oq, ok = _run(apply_rotary_partial, q, k, cos, sin, "partial")
    # The channels past R come out bitwise unchanged, and their gradient is the upstream one.
    assert torch.equal(oq[..., r:], q.detach()[..., r:])
    assert torch.equal(ok[..., r:], k.detach()[..., r:])


@pytest.mark.skipif(not SUPPORTS_PARTIAL, reason="installed liger-kernel has no rotary_dim (needs >= 0.8.5)")
def test_partial_matches_the_core_reference(device):
    core = core_kernels("rotary")
    b, hq, hk, s, d, r = 2, 4, 2, 6, 32, 8
    q, k = _qk(b, hq, hk, s, d, torch.float32, device, "bshd")
    cos, sin = rope_cos_sin(b, s, r, torch.float32, device)
    oq, ok = apply_rotary_partial(q, k, cos, sin)
    eq, ek = core.apply_rotary(q.detach(), k.detach(), cos, sin)
    assert_close(oq, eq, "rotary", "partial", "q vs core eager")
    assert_close(ok, ek, "rotary", "partial", "k vs core eager")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_full_matches_the_core_reference_forward_and_backward(device, dtype):
    core = core_kernels("rotary")
    b, hq, hk, s, d = 1, 2, 2, 9, 16
    q, k = _qk(b, hq, hk, s, d, dtype, device, "bshd")
    cos, sin = rope_cos_sin(1, s, d, dtype, device)  # batch-1 cos broadcast over the batch
    oq, ok = apply_rotary_full(q, k, cos, sin)
    q2 = q.detach().clone().requires_grad_()
    k2 = k.detach().clone().requires_grad_()
    eq, ek = core.apply_rotary(q2, k2, cos, sin)
    assert_close(oq, eq, "rotary", "full", "q vs core eager")
    assert_close(ok, ek, "rotary", "full", "k vs core eager")
    g = torch.randn_like(oq), torch.randn_like(ok)
    torch.autograd.backward((oq, ok), g)
    torch.autograd.backward((eq, ek), g)
    assert_close(q.grad, q2.grad, "rotary", "full", "dq vs core eager")
    assert_close(k.grad, k2.grad, "rotary", "full", "dk vs core eager")


def test_cos_of_another_dtype_is_cast_to_q_dtype(device):
    b, h, s, d = 1, 2, 4, 16
    q, k = _qk(b, h, h, s, d, torch.float16, device, "bshd")
    cos, sin = rope_cos_sin(b, s, d, torch.float32, device)
    oq, ok = apply_rotary_full(q, k, cos, sin)
    oq2, ok2 = apply_rotary_full(q, k, cos.half(), sin.half())
    assert oq.dtype == ok.dtype == torch.float16
    assert torch.equal(oq, oq2) and torch.equal(ok, ok2)
    rq, _ = rope_reference(q, k, cos, sin)
    assert_close(oq, rq, "rotary", "full", "q_embed with float32 cos")


def test_full_refuses_partial_inputs(device):
    q, k = _qk(1, 2, 2, 3, 32, torch.float32, device, "bshd")
    cos, sin = rope_cos_sin(1, 3, 16, torch.float32, device)
    with pytest.raises(ValueError, match="partial"):
        apply_rotary_full(q, k, cos, sin)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda q, k, c, s: (q.double(), k, c, s), "float64"),
        (lambda q, k, c, s: (q[0], k, c, s), "4-D"),
        (lambda q, k, c, s: (q, k[:, :, :2], c, s), "must match q"),
        (lambda q, k, c, s: (q, k, c[..., :3], s[..., :3]), "even"),
        (lambda q, k, c, s: (q, k, c, s[:, :2]), "same shape"),
        (lambda q, k, c, s: (q, k, c[:, :2], s[:, :2]), "do not fit"),
        (lambda q, k, c, s: (q, k, c[0], s[0]), "3-D"),
    ],
)
def test_bad_inputs_raise_clear_errors(device, mutate, match):
    q, k = _qk(2, 2, 2, 3, 16, torch.float32, device, "bshd")
    cos, sin = rope_cos_sin(2, 3, 16, torch.float32, device)
    with pytest.raises((ValueError, TypeError), match=match):
        apply_rotary_full(*mutate(q, k, cos, sin))
