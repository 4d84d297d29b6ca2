"""moe_experts kernels: eager (transformers' loop) and grouped_mm (sort + torch._grouped_mm).

float64 reference forward and backward, transformers' Qwen3MoeExperts bitwise, routing edge
cases (idle experts, one expert for everything, duplicate routes), errors.
"""

import pytest
import torch
from veomni_ops.backends import reference
from veomni_ops.kernels.moe import grouped_mm_available, moe_experts_eager, moe_experts_grouped_mm

KERNELS = {"eager": moe_experts_eager, "grouped_mm": moe_experts_grouped_mm}


def spec(name):
    return next(s for s in reference.moe_experts() if s.name == name)


def assert_within(actual, expected, tol, what, atol_scale=1.0):
    diff = (actual.double() - expected).abs()
    bad = diff > tol.atol * atol_scale + tol.rtol * expected.abs()
    assert not bad.any(), f"{what}: {int(bad.sum())}/{bad.numel()} outside {tol}; max |diff| {diff.max().item():.3g}"


def ref64(x, idx, w, gate_up, down):
    """Dense per-route float64 reference: gather each route's expert weights, no sorting."""
    x, w, gate_up, down = x.double(), w.double(), gate_up.double(), down.double()
    gu = torch.einsum("th,tkoh->tko", x, gate_up[idx])  # [T, K, 2I]
    g, u = gu.chunk(2, dim=-1)
    act = g * torch.sigmoid(g) * u
    y = torch.einsum("tki,tkhi->tkh", act, down[idx])  # [T, K, H]
    return (w[..., None] * y).sum(1)


def make(t, h, i, e, k, dtype, seed, routing="random"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dtype).requires_grad_()
    gate_up = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(dtype).requires_grad_()
    down = (torch.randn(e, h, i, generator=g) / i**0.5).to(dtype).requires_grad_()
    if routing == "random":  # distinct experts per token, as a router's top-k gives
        idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]) if t else torch.zeros(0, k).long()
    elif routing == "one_expert":
        idx = torch.full((t, k), e - 1)
    elif routing == "duplicates":
        idx = torch.randint(0, e, (t, k), generator=g)
        idx[:, -1] = idx[:, 0]  # every token lists one expert twice
    elif routing == "idle_experts":
        idx = torch.randint(0, e, (t, k), generator=g) % 2 * 2  # only experts 0 and 2; 1 and 3.. get nothing
    w = torch.rand(t, k, generator=g).to(dtype).requires_grad_()
    return x, idx, w, gate_up, down


CASES = [
    # kernel, dtype
    ("eager", torch.float32),
    ("eager", torch.bfloat16),
    ("eager", torch.float16),
    ("grouped_mm", torch.bfloat16),
    ("grouped_mm", torch.float32),  # CPU also runs float32 (CUDA refuses it, see test_errors)
]


@pytest.mark.parametrize("kernel,dtype", CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("routing", ["random", "one_expert", "duplicates", "idle_experts"])
def test_vs_float64(kernel, dtype, routing):
    t, h, i, e, k = 19, 16, 24, 6, 3
    x, idx, w, gate_up, down = make(t, h, i, e, k, dtype, seed=len(routing), routing=routing)
    inputs = (x, w, gate_up, down)
    out = KERNELS[kernel](x, idx, w, gate_up, down)
    assert out.dtype == dtype and out.shape == (t, h)
    gy = torch.randn(t, h).to(dtype)
    grads = torch.autograd.grad(out, inputs, gy)
    ins64 = [a.detach().double().requires_grad_() for a in inputs]
    out64 = ref64(ins64[0], idx, ins64[1], ins64[2], ins64[3])
    grads64 = torch.autograd.grad(out64, ins64, gy.double())
    tol = spec(kernel).tolerance(str(dtype))
    assert_within(out, out64, tol, "output")
    for what, g, g64 in zip(("hidden_states", "top_k_weights", "gate_up_proj", "down_proj"), grads, grads64):
        assert g.dtype == dtype, what
        # top_k_weights' gradient is a dot product over H; the weights' sum over the tokens.
        assert_within(g, g64, tol, f"grad {what}", atol_scale=3.0)


def test_eager_gradcheck_float64():
    x, idx, w, gate_up, down = make(5, 3, 2, 4, 2, torch.float64, seed=0, routing="duplicates")
    assert torch.autograd.gradcheck(lambda a, b, c, d: moe_experts_eager(a, idx, b, c, d), (x, w, gate_up, down))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_eager_bitwise_equal_to_transformers(dtype):
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(hidden_size=16, moe_intermediate_size=8, num_experts=5, num_experts_per_tok=2)
    experts = Qwen3MoeExperts(cfg).to(dtype)
    x, idx, w, gate_up, down = make(13, 16, 8, 5, 2, dtype, seed=9, routing="duplicates")
    with torch.no_grad():
        experts.gate_up_proj.copy_(gate_up)
        experts.down_proj.copy_(down)
    xa, xb = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    ya = experts(xa, idx, w.detach())
    yb = moe_experts_eager(xb, idx, w.detach(), experts.gate_up_proj, experts.down_proj)
    assert torch.equal(ya, yb)
    g = torch.randn_like(ya)
    assert torch.equal(torch.autograd.grad(ya, xa, g)[0], torch.autograd.grad(yb, xb, g)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grouped_mm_matches_eager_and_non_contiguous_hidden(dtype):
    torch.manual_seed(7)
    x, idx, w, gate_up, down = make(33, 16, 8, 4, 2, dtype, seed=7)
    strided = torch.randn(33, 2, 16).to(dtype)[:, 0]
    assert not strided.is_contiguous()
    a = moe_experts_grouped_mm(strided, idx, w, gate_up, down)
    b = moe_experts_grouped_mm(strided.contiguous(), idx, w, gate_up, down)
    assert torch.equal(a, b)
    c = moe_experts_eager(strided, idx, w, gate_up, down)
    tol = spec("grouped_mm").tolerance(str(dtype))
    assert_within(a, c.double(), tol, "grouped_mm vs eager")


def test_grouped_mm_single_token_single_route_and_int32_index():
    x, idx, w, gate_up, down = make(1, 8, 8, 3, 1, torch.float32, seed=1)
    out = moe_experts_grouped_mm(x, idx.int(), w, gate_up, down)
    torch.testing.assert_close(out.double(), ref64(x, idx, w, gate_up, down), rtol=1e-5, atol=1e-6)


def test_grouped_mm_out_of_range_routes_contribute_nothing():
    x, idx, w, gate_up, down = make(10, 8, 8, 4, 2, torch.float32, seed=2)
    dropped = idx.clone()
    dropped[::3, 1] = 4  # transformers' expert-parallel sentinel: E
    dropped[1, 0] = -1
    keep = (dropped >= 0) & (dropped < 4)
    out = moe_experts_grouped_mm(x, dropped, w, gate_up, down)
    expected = ref64(x, idx, w * keep, gate_up, down)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_out_of_range_routes_have_finite_zero_gradients(dtype):
    # Rows past the last group offset are never written by torch._grouped_mm's backward
    # either; those gradients must not leak (this once gave NaN d_hidden in bf16).
    x, idx, w, gate_up, down = make(24, 32, 16, 4, 2, dtype, seed=3)
    idx[::3, 1] = 4
    keep = idx < 4
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, w, gate_up, down)]
    moe_experts_grouped_mm(leaves[0], idx, leaves[1], leaves[2], leaves[3]).float().sum().backward()
    ref = [t.detach().double().requires_grad_(True) for t in (x, w, gate_up, down)]
    moe_experts_eager(ref[0], torch.where(keep, idx, 0), ref[1] * keep, ref[2], ref[3]).sum().backward()
    for got, want in zip(leaves, ref):
        assert torch.isfinite(got.grad).all()
        scale = want.grad.abs().max().clamp_min(1.0)
        assert ((got.grad.double() - want.grad).abs().max() / scale) < (3e-2 if dtype == torch.bfloat16 else 1e-5)
    assert (leaves[1].grad[::3, 1] == 0).all()


def test_grouped_mm_available_and_spec():
    assert grouped_mm_available() is True  # torch 2.13 has torch._grouped_mm
    assert grouped_mm_available("cpu") is True
    s = spec("grouped_mm")
    assert s.dtypes == ("bfloat16",) and s.priority == 10
    assert s.hardware.min_capability == (9, 0)
    assert not spec("eager").supports_compile  # nonzero + data-dependent shapes


def test_errors():
    x, idx, w, gate_up, down = make(4, 16, 8, 3, 2, torch.float32, seed=3)
    for fn in KERNELS.values():
        with pytest.raises(ValueError, match=r"\[E, H, I\]"):
            fn(x, idx, w, gate_up, down[:, :, :4])
        with pytest.raises(ValueError, match=r"\[E, 2I, H\]"):
            fn(x, idx, w, gate_up[:, :, :8], down)
        with pytest.raises(ValueError, match=r"\[T, K\]"):
            fn(x, idx[:, :1], w, gate_up, down)
        with pytest.raises(TypeError, match="integer tensor"):
            fn(x, idx.float(), w, gate_up, down)
        with pytest.raises(TypeError, match="different dtypes"):
            fn(x.double(), idx, w, gate_up, down)
    with pytest.raises(ValueError, match="multiples of 4"):
        xs, idxs, ws, gus, dns = make(4, 6, 8, 3, 2, torch.float32, seed=4)
        moe_experts_grouped_mm(xs, idxs, ws, gus, dns)
    with pytest.raises(TypeError, match="no float64"):
        moe_experts_grouped_mm(*[a.double() if a.is_floating_point() else a for a in (x, idx, w, gate_up, down)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grouped_mm_every_route_a_sentinel_gives_zeros_and_zero_gradients(dtype):
    # all routes sort into the last group and gather the zero row: exact zeros, nothing leaks
    x, idx, w, gate_up, down = make(6, 16, 8, 4, 2, dtype, seed=11)
    idx = torch.full_like(idx, 4)
    idx[0, 0] = -1
    out = moe_experts_grouped_mm(x, idx, w, gate_up, down)
    grads = torch.autograd.grad(out.float().sum(), (x, w, gate_up, down), allow_unused=False)
    assert torch.count_nonzero(out) == 0
    for g in grads:
        assert torch.count_nonzero(g) == 0


def test_grouped_mm_without_experts_is_zero_and_keeps_the_graph():
    x, idx, w, gate_up, down = make(5, 16, 8, 4, 2, torch.float32, seed=12)
    gate_up, down = gate_up[:0], down[:0]
    out = moe_experts_grouped_mm(x, torch.full_like(idx, -1), w, gate_up, down)
    assert out.shape == x.shape and torch.count_nonzero(out) == 0
    (gx,) = torch.autograd.grad(out.sum(), (x,))
    assert torch.count_nonzero(gx) == 0


def test_grouped_mm_no_tokens():
    x, idx, w, gate_up, down = make(0, 8, 8, 3, 2, torch.float32, seed=5)
    out = moe_experts_grouped_mm(x, idx, w, gate_up, down)
    assert out.shape == (0, 8)
    gu_grad, dn_grad = torch.autograd.grad(out.sum(), (gate_up, down))
    assert torch.count_nonzero(gu_grad) == 0 and torch.count_nonzero(dn_grad) == 0


# --- expert indices outside [0, E): -1 and E route nowhere, anything else is an error --------
@pytest.mark.parametrize("kernel,dtype", [("eager", torch.float32), ("eager", torch.bfloat16),
                                          ("grouped_mm", torch.bfloat16)], ids=str)
def test_sentinel_routes_minus_one_and_e_contribute_zero(kernel, dtype):
    x, idx, w, gate_up, down = make(12, 16, 8, 4, 2, dtype, seed=8)
    routed = idx.clone()
    routed[::3, 1] = 4  # E: transformers' expert-parallel sentinel
    routed[1::4, 0] = -1  # -1: an EP dispatcher's "no expert on this rank"
    keep = (routed >= 0) & (routed < 4)
    out = KERNELS[kernel](x, routed, w, gate_up, down)
    assert torch.isfinite(out).all()
    expected = ref64(x, idx, w * keep, gate_up, down)
    assert_within(out, expected.detach(), spec(kernel).tolerance(str(dtype)), f"{kernel} sentinels")
    gx, gw = torch.autograd.grad(out.float().sum(), (x, w))
    assert torch.isfinite(gx).all() and (gw[~keep] == 0).all()


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("bad", [5, -2, 1 << 40])
def test_other_out_of_range_indices_raise_naming_op_index_and_e(kernel, bad):
    x, idx, w, gate_up, down = make(6, 16, 8, 4, 2, torch.bfloat16, seed=9)
    idx = idx.clone()
    idx[0, 1] = 4  # a sentinel beside the bad index: allowed
    idx[4, 0] = bad
    with pytest.raises(ValueError, match=rf"^moe_experts: top_k_index holds {bad}, outside \[0, 4\) for E = 4"):
        KERNELS[kernel](x, idx, w, gate_up, down)


def test_index_check_policy(monkeypatch):
    from veomni_ops.kernels import checks
    from veomni_ops.kernels import moe as M
    from veomni_ops.ops.moe_experts import checks as moe_checks

    idx = torch.tensor([[0, 7]])
    # kernels that synchronise anyway always read the values
    with pytest.raises(ValueError, match="holds 7"):
        M.check_expert_index(idx, 4, always=True)
    # an accelerator tensor (pretend): without the switch the rule is asserted on the device,
    # with VEOMNI_OPS_CHECK_VALUES=1 (value_checks) the values are read and the error is exact
    # (the rule is defined in the op's folder, ops/moe_experts/checks.py; kernels.checks and
    # kernels.moe re-export it, so the module to patch is the one that defines it)
    assert M.check_expert_index is checks.check_expert_index is moe_checks.check_expert_index
    monkeypatch.setattr(moe_checks, "can_read_values", lambda x: checks.value_checks_on())
    asserted = []
    monkeypatch.setattr(moe_checks, "device_assert", lambda ok, msg: asserted.append((bool(ok), msg)))
    M.check_expert_index(idx, 4)
    assert asserted == [(False, moe_checks._index_message("moe_experts", None, 4))]
    with checks.value_checks():
        with pytest.raises(ValueError, match="holds 7"):
            M.check_expert_index(idx, 4, backend="x")
    assert not checks.value_checks_on()


def test_grouped_mm_compiles_with_the_index_rule():
    x, idx, w, gate_up, down = make(6, 16, 8, 4, 2, torch.bfloat16, seed=10)
    fn = torch.compile(moe_experts_grouped_mm, fullgraph=True, backend="aot_eager")
    sentinel = idx.clone()
    sentinel[2, 0] = 4
    torch.testing.assert_close(fn(x, sentinel, w, gate_up, down), moe_experts_grouped_mm(x, sentinel, w, gate_up, down))
    sentinel[3, 1] = 6
    with pytest.raises(RuntimeError, match=r"top_k_index holds an index, outside \[0, 4\) for E = 4"):
        fn(x, sentinel, w, gate_up, down)
