"""RoPE Triton kernel vs a float64 reference (and the core's eager kernel), fwd and bwd."""

from __future__ import annotations

import pytest
import torch
from _helpers import DTYPES, assert_close, core_kernels, graph_capturing_backend
from veomni_triton.kernels.rotary import apply_rotary


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def reference(q, k, cos, sin):
    """transformers' apply_rotary_pos_emb in float64, partial rotary included."""
    r = cos.shape[-1]
    c, s = cos.double().unsqueeze(1), sin.double().unsqueeze(1)
    out = []
    for x in (q, k):
        x = x.double()
        rot, rest = x[..., :r], x[..., r:]
        out.append(torch.cat((rot * c + rotate_half(rot) * s, rest), dim=-1))
    return out


def tables(b: int, s: int, r: int, device, dtype):
    """cos/sin as a model builds them: cat(freqs, freqs) of positions times inverse frequencies."""
    inv = 1.0 / (10000 ** (torch.arange(0, r, 2, device=device, dtype=torch.float32) / r))
    pos = torch.randint(0, 4096, (b, s), device=device).float()
    freqs = pos[..., None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def make_qk(b, hq, hk, s, d, device, dtype, layout: str):
    if layout == "bhsd":
        q = torch.randn(b, hq, s, d, device=device, dtype=dtype)
        k = torch.randn(b, hk, s, d, device=device, dtype=dtype)
    else:  # the projection output [B, S, H, D] transposed: non-contiguous, no copy expected
        q = torch.randn(b, s, hq, d, device=device, dtype=dtype).transpose(1, 2)
        k = torch.randn(b, s, hk, d, device=device, dtype=dtype).transpose(1, 2)
    return q, k


def run_and_check(q, k, cos, sin, what: str):
    q = q.detach().requires_grad_()
    k = k.detach().requires_grad_()
    qo, ko = apply_rotary(q, k, cos, sin)
    assert qo.shape == q.shape and ko.shape == k.shape
    assert qo.dtype == q.dtype and ko.dtype == k.dtype
    dq_out, dk_out = torch.randn_like(qo), torch.randn_like(ko)
    torch.autograd.backward((qo, ko), (dq_out, dk_out))
    q64 = q.detach().double().requires_grad_()
    k64 = k.detach().double().requires_grad_()
    qr, kr = reference(q64, k64, cos, sin)
    torch.autograd.backward((qr, kr), (dq_out.double(), dk_out.double()))
    assert_close(qo, qr, "rotary", f"{what} q_embed")
    assert_close(ko, kr, "rotary", f"{what} k_embed")
    assert_close(q.grad, q64.grad, "rotary", f"{what} dq")
    assert_close(k.grad, k64.grad, "rotary", f"{what} dk")
    return qo, ko


# every dtype x rotary fraction, both layouts, MHA and GQA (Hq/Hk 3 and 5), without the full product
CASES = [
    (torch.float32, "full", "bhsd", (4, 4)),
    (torch.bfloat16, "full", "bshd_transposed", (6, 2)),
    (torch.bfloat16, "full", "bhsd", (5, 1)),
    (torch.float32, "half", "bshd_transposed", (6, 2)),
    (torch.bfloat16, "half", "bhsd", (5, 1)),
    (torch.float32, "half", "bshd_transposed", (4, 4)),
    (torch.float32, "quarter", "bhsd", (6, 2)),
    (torch.bfloat16, "quarter", "bshd_transposed", (5, 1)),
]


@pytest.mark.parametrize("dtype,rot,layout,heads", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_matches_float64_reference(device, dtype, rot, layout, heads):
    b, s, d = 2, 3, 32
    r = {"full": d, "half": d // 2, "quarter": d // 4}[rot]
    hq, hk = heads
    q, k = make_qk(b, hq, hk, s, d, device, dtype, layout)
    cos, sin = tables(b, s, r, device, dtype)
    qo, ko = run_and_check(q, k, cos, sin, f"{rot} {layout} {heads}")
    # outputs keep the input layout (transposed stays transposed: no hidden copy downstream)
    assert qo.stride() == q.stride() and ko.stride() == k.stride()


@pytest.mark.parametrize("d,r", [(24, 12), (40, 10)])
def test_odd_head_and_rotary_dims(device, d, r):
    """Head/rotary dims that are not powers of two (masked lanes) still give exact results."""
    q, k = make_qk(2, 3, 1, 3, d, device, torch.float32, "bhsd")
    cos, sin = tables(2, 3, r, device, torch.float32)
    run_and_check(q, k, cos, sin, f"d={d} r={r}")


def test_batch_one_tables_broadcast(device):
    """cos/sin [1, S, R] (shared position_ids) apply to every batch row."""
    q, k = make_qk(3, 4, 2, 2, 16, device, torch.float32, "bhsd")
    cos, sin = tables(1, 2, 16, device, torch.float32)
    run_and_check(q, k, cos, sin, "batch-1 tables")


def test_float32_tables_with_bf16_inputs(device):
    q, k = make_qk(2, 2, 1, 4, 16, device, torch.bfloat16, "bhsd")
    cos, sin = tables(2, 4, 8, device, torch.float32)
    run_and_check(q, k, cos, sin, "fp32 tables")


def test_many_heads_loop_over_head_tiles(device):
    """More heads than one head tile holds: the in-program loop over head tiles."""
    from veomni_triton.kernels.rotary import rope_config

    b, s, d = 1, 2, 256
    hq, hk = 20, 3
    _, _, block_hq, _, _ = rope_config(hq, hk, d, d)
    assert block_hq < hq
    q, k = make_qk(b, hq, hk, s, d, device, torch.float32, "bshd_transposed")
    cos, sin = tables(b, s, d, device, torch.float32)
    run_and_check(q, k, cos, sin, "many heads")


def test_backward_is_rotation_by_minus_sin(device):
    """The gradient of q is dq_out rotated by -sin (the transpose of an orthogonal map)."""
    q, k = make_qk(1, 2, 1, 3, 16, device, torch.float32, "bhsd")
    cos, sin = tables(1, 3, 16, device, torch.float32)
    q.requires_grad_()
    k.requires_grad_()
    qo, ko = apply_rotary(q, k, cos, sin)
    g = torch.randn_like(qo)
    (qo * g).sum().backward()
    expected, _ = apply_rotary(g, torch.zeros_like(k), cos, -sin)
    torch.testing.assert_close(q.grad, expected, atol=1e-6, rtol=1e-5)
    assert torch.equal(k.grad, torch.zeros_like(k))


def test_matches_core_eager(device):
    core = core_kernels("rotary")
    for dtype in DTYPES:
        for r in (16, 8):
            q, k = make_qk(2, 4, 2, 5, 16, device, dtype, "bshd_transposed")
            cos, sin = tables(2, 5, r, device, dtype)
            q.requires_grad_()
            k.requires_grad_()
            qo, ko = apply_rotary(q, k, cos, sin)
            go, gk = torch.randn_like(qo), torch.randn_like(ko)
            torch.autograd.backward((qo, ko), (go, gk))
            qr_in = q.detach().clone().requires_grad_()
            kr_in = k.detach().clone().requires_grad_()
            qr, kr = core.apply_rotary(qr_in, kr_in, cos, sin)
            torch.autograd.backward((qr, kr), (go, gk))
            for a, e, what in ((qo, qr, "q"), (ko, kr, "k"), (q.grad, qr_in.grad, "dq"), (k.grad, kr_in.grad, "dk")):
                assert_close(a, e, "rotary", f"vs core r={r} {what}")


def test_compile_fullgraph_no_break(device):
    graphs: list = []

    def f(q, k, cos, sin):
        qo, ko = apply_rotary(q, k, cos, sin)
        return qo.square().sum() + ko.square().sum() * 0.5

    compiled = torch.compile(f, fullgraph=True, backend=graph_capturing_backend(graphs))
    q, k = make_qk(2, 4, 2, 3, 16, device, torch.float32, "bshd_transposed")
    cos, sin = tables(2, 3, 8, device, torch.float32)
    q.requires_grad_()
    k.requires_grad_()
    compiled(q, k, cos, sin).backward()
    assert len(graphs) == 1
    assert "veomni_triton.rotary" in graphs[0].code
    q2 = q.detach().clone().requires_grad_()
    k2 = k.detach().clone().requires_grad_()
    f(q2, k2, cos, sin).backward()
    torch.testing.assert_close(q.grad, q2.grad)
    torch.testing.assert_close(k.grad, k2.grad)


def test_errors_are_clear(device):
    q, k = make_qk(2, 4, 2, 3, 16, device, torch.float32, "bhsd")
    cos, sin = tables(2, 3, 16, device, torch.float32)
    with pytest.raises(ValueError, match="must be even"):
        apply_rotary(q, k, cos[..., :15], sin[..., :15])
    big_cos, big_sin = tables(2, 3, 18, device, torch.float32)
    with pytest.raises(ValueError, match="must be even and in 2..D=16"):
        apply_rotary(q, k, big_cos, big_sin)
    with pytest.raises(ValueError, match="same shape|one shape"):
        apply_rotary(q, k, cos, sin[..., :8])
    with pytest.raises(ValueError, match=r"\[B, H, S, D\]"):
        apply_rotary(q[0], k[0], cos, sin)
    with pytest.raises(ValueError, match="share batch, sequence and head dim"):
        apply_rotary(q, k[..., :8], cos, sin)
    with pytest.raises(ValueError, match="B = 2"):
        apply_rotary(q, k, cos[:, :2], sin[:, :2])
    with pytest.raises(ValueError, match="detach"):
        apply_rotary(q, k, cos.requires_grad_(), sin)
    with pytest.raises(TypeError, match="int64"):
        apply_rotary(q.long(), k, cos, sin)
