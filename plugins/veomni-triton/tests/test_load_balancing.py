"""Fused load-balancing loss vs transformers' load_balancing_loss_func in float64, fwd and bwd."""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_close, core_kernels, tolerance
from veomni_triton.kernels import load_balancing as LB

F32, BF16 = torch.float32, torch.bfloat16
OP = "load_balancing_loss"


def transformers_loss(logits, num_experts, top_k, mask):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    return load_balancing_loss_func(tuple(logits), num_experts, top_k, mask)


def run(fn, logits, num_experts, top_k, mask, cast=None, grad_scale=1.0):
    leaves = [x.detach().to(cast or x.dtype).requires_grad_() for x in logits]
    loss = fn(leaves, num_experts, top_k, mask)
    (loss * grad_scale).backward()
    return loss.detach(), [x.grad for x in leaves]


def check(ours, ref, what):
    loss, grads = ours
    loss64, grads64 = ref
    assert loss.dtype == torch.float32
    assert_close(loss, loss64, OP, f"{what} loss")
    for i, (g, g64) in enumerate(zip(grads, grads64)):
        assert g.dtype == grads[0].dtype and g.shape == g64.shape
        assert_close(g, g64, OP, f"{what} d_logits[{i}]")


@pytest.mark.parametrize(
    "dtype,masked,e,k",
    [(F32, False, 8, 2), (F32, True, 8, 2), (BF16, True, 8, 2), (F32, True, 6, 3), (F32, False, 5, 5)],
)
def test_matches_transformers_in_float64(dtype, masked, e, k):
    num_layers, b, s = 3, 2, 19
    logits = [torch.randn(b * s, e, dtype=dtype) * 2 for _ in range(num_layers)]
    mask = (torch.rand(b, s) > 0.3).long() if masked else None
    ours = run(LB.load_balancing_loss, logits, e, k, mask, grad_scale=3.0)
    ref = run(transformers_loss, logits, e, k, mask, cast=torch.float64, grad_scale=3.0)
    check(ours, ref, f"{dtype} masked={masked} E={e} K={k}")
    # bitwise reproducible: fixed-order reductions, no atomics
    again = run(LB.load_balancing_loss, logits, e, k, mask, grad_scale=3.0)
    assert torch.equal(ours[0], again[0])
    assert all(torch.equal(a, b) for a, b in zip(ours[1], again[1]))


def test_matches_core_reference():
    core = core_kernels("load_balancing")
    logits = [torch.randn(24, 8) for _ in range(2)]
    mask = (torch.rand(4, 6) > 0.25).to(torch.int64)
    ours = run(LB.load_balancing_loss, logits, 8, 2, mask)
    ref = run(core.load_balancing_loss, logits, 8, 2, mask)
    torch.testing.assert_close(ours[0], ref[0], atol=1e-6, rtol=1e-5)
    for a, b in zip(ours[1], ref[1]):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)


def test_strided_logits_many_programs_and_ties():
    # 300 tokens: several token strips per layer; each layer is a column slice of a wider router
    # output (row stride 20, read in place, no copy)
    e, k = 16, 4
    logits = [torch.randn(300, 20)[:, 2:18] for _ in range(3)]
    assert logits[0].stride(0) == 20
    ours = run(LB.load_balancing_loss, logits, e, k, None)
    ref = run(transformers_loss, logits, e, k, None, cast=torch.float64)
    check(ours, ref, "strided")
    # every token ties on all experts: the top-k takes the lowest indices (torch.topk's choice
    # among ties is unspecified, so no transformers comparison), and with P_e = 1/E the loss is
    # E * sum_e (count_e / N) / E = K whichever experts win
    uniform, grads = run(LB.load_balancing_loss, [torch.zeros(300, e)], e, k, None)
    assert uniform.item() == pytest.approx(k, rel=1e-6)
    # the gradient shows which experts won: p = 1/E, g_e = E*count_e/N^2 (count_e = N for the
    # first k experts, 0 for the rest), dlogit_e = p * (g_e - mean_p(g))
    t = 300
    expected = torch.full((t, e), -k / (e * t), dtype=torch.float64)
    expected[:, :k] = (e - k) / (e * t)
    torch.testing.assert_close(grads[0].double(), expected, atol=1e-9, rtol=1e-5)


def test_stacked_tensor_input_and_compile():
    e, k = 8, 2
    stacked = torch.randn(2, 10, e)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1, 3:] = False
    eager = LB.load_balancing_loss(stacked, e, k, mask)
    assert torch.equal(eager, LB.load_balancing_loss(list(stacked.unbind(0)), e, k, mask))

    def fn(layers, msk):
        return LB.load_balancing_loss(layers, e, k, msk) * 0.01

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    want = run(lambda xs, *_: fn(xs, mask), list(stacked.unbind(0)), e, k, None)
    got = run(lambda xs, *_: compiled(xs, mask), list(stacked.unbind(0)), e, k, None)
    assert torch.equal(got[0], want[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


def test_bad_inputs_are_explained():
    x = [torch.randn(6, 4), torch.randn(6, 4)]
    with pytest.raises(ValueError, match="num_experts=5"):
        LB.load_balancing_loss(x, 5, 2)
    with pytest.raises(ValueError, match="top_k=0"):
        LB.load_balancing_loss(x, 4, 0)
    with pytest.raises(ValueError, match="every layer must give"):
        LB.load_balancing_loss([x[0], torch.randn(5, 4)], 4, 2)
    with pytest.raises(ValueError, match="B\\*S == T"):
        LB.load_balancing_loss(x, 4, 2, torch.ones(2, 4))
    with pytest.raises(TypeError, match="non-empty sequence"):
        LB.load_balancing_loss([], 4, 2)


def test_ties_at_the_top_k_boundary_take_the_lowest_index():
    # The kernel's fast top-k drops every entry equal to a row's max per round; rows where that
    # drops more than K entries are redone exactly. Mixed tiles: ties straddling the K-th place,
    # ties inside the top-k, underflowing probabilities (exact zeros), plain rows, and layers
    # whose tiles share programs (the strips cross layer boundaries).
    e, k = 8, 3
    base = torch.randn(3, 29, e, dtype=torch.float64)
    base[0, 3] = torch.tensor([0.0, 3.0, 1.0, 5.0, 1.0, 0.0, 0.0, 0.0])  # 3rd place tied: 2 and 4
    base[1, 7] = torch.tensor([2.0, 2.0, 2.0, 2.0, -1.0, 0.0, 0.0, 0.0])  # 4 tied for 3 places
    base[2, 11] = torch.tensor([-200.0] * 6 + [0.0, -200.0])  # one expert, the rest underflow to 0
    base[1, 20] = torch.tensor([1.0, 0.5, 1.0, 0.5, 0.5, 0.0, 0.0, 0.0])  # ties inside and at the edge
    logits = [x.float() for x in base.unbind(0)]
    got, _ = run(LB.load_balancing_loss, logits, e, k, None)

    # float64 reference with the same tie rule: a stable descending sort keeps the lower index first
    p = torch.softmax(torch.stack([x.double() for x in logits]), dim=-1)
    top = torch.sort(p, dim=-1, descending=True, stable=True).indices[..., :k]
    counts = torch.zeros(e, dtype=torch.float64).index_add_(0, top.reshape(-1), torch.ones(top.numel(), dtype=torch.float64))
    n = p.shape[0] * p.shape[1]
    want = e * torch.sum(counts / n * p.sum(dim=(0, 1)) / n)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)
    # the tie rule matters here: choosing the higher index at the boundary gives another loss
    alt = top.clone()
    alt[0, 3] = torch.tensor([3, 1, 4])
    counts_alt = torch.zeros(e, dtype=torch.float64).index_add_(0, alt.reshape(-1), torch.ones(alt.numel(), dtype=torch.float64))
    assert abs(e * torch.sum(counts_alt / n * p.sum(dim=(0, 1)) / n) - want) > 1e-4


def test_pointer_table_depends_on_the_dtype():
    # the table holds offsets in elements, and tables are cached by address: the same addresses
    # read as another dtype need another table (a cache hit here would read the wrong rows)
    buf = torch.zeros(4096, dtype=torch.uint8)
    f32 = [buf[:1024].view(torch.float32).view(16, 16), buf[2048:3072].view(torch.float32).view(16, 16)]
    # same addresses, same row strides (16 elements), other element size
    b16 = [buf[:1024].view(torch.bfloat16).as_strided((16, 16), (16, 1)),
           buf[2048:3072].view(torch.bfloat16).as_strided((16, 16), (16, 1))]
    t32, _ = LB._pointer_table(f32)
    t16, _ = LB._pointer_table(b16)
    assert t32.tolist() == [0, 512, 16, 16]
    assert t16.tolist() == [0, 1024, 16, 16]
    assert LB._pointer_table(f32)[0] is t32  # a repeat call is a cache hit


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_no_token_counted_gives_zero_not_nan(dtype):
    # Every token masked out, or no token at all: the contract's value is 0 with zero
    # gradients (transformers divides 0 by 0 there).
    e, k = 8, 2
    logits = [torch.randn(12, e, dtype=dtype) for _ in range(3)]
    loss, grads = run(LB.load_balancing_loss, logits, e, k, torch.zeros(3, 4, dtype=torch.long))
    assert loss.item() == 0.0 and all(torch.equal(g, torch.zeros_like(g)) for g in grads)
    empty = [torch.randn(0, e, dtype=dtype) for _ in range(2)]
    for mask in (None, torch.ones(0, 5, dtype=torch.long)):
        loss, grads = run(LB.load_balancing_loss, empty, e, k, mask)
        assert loss.item() == 0.0 and all(g.shape == (0, e) for g in grads)
    # the core's eager kernel gives the same
    core = core_kernels("load_balancing")
    assert run(core.load_balancing_loss, logits, e, k, torch.zeros(3, 4, dtype=torch.long))[0].item() == 0.0
    assert run(core.load_balancing_loss, empty, e, k, None)[0].item() == 0.0


def test_float32_gradient_meets_the_float32_tolerance_where_routing_is_balanced():
    # 4096 tokens, 64 experts, top-4, a padding mask: every expert's backward coefficient is
    # close to their mean, and the softmax backward p * (g - sum(p * g)) cancels most of their
    # digits. With the uncentred coefficients this case measured 1.74 in the kit's units (the
    # H100 check of 2026-11-21 found 42 float32 gradients at 1.0-2.35, passing only through the
    # 16-bit allowance of eager's error); centred, 0.04. Held to the spec's float32 tolerance.
    from veomni_ops.testing.cases import Builder, _router_logits
    from veomni_ops.testing.runner import compare

    e, k, t = 64, 4, 4096
    logits = [_router_logits(Builder(3, F32, "cpu"), t, e)]
    mask = (torch.rand(4, t // 4, generator=torch.Generator().manual_seed(1)) > 0.3).long()
    ours = run(LB.load_balancing_loss, logits, e, k, mask, grad_scale=0.9)
    core = core_kernels("load_balancing")
    ref = run(core.load_balancing_loss, logits, e, k, mask, cast=torch.float64, grad_scale=0.9)
    tol = tolerance(OP, F32)
    worst = compare("grad", ours[1][0], ref[1][0], tol).ratio
    assert worst <= 0.5, f"float32 gradient error {worst:.3g} (kit units, pass <= 1)"


def test_every_call_is_checked_again_after_a_good_one():
    # the one-pass check of the layers keeps nothing from an earlier call: the same tensors
    # with one layer swapped for a bad one are refused with the layer named
    x = [torch.randn(6, 4), torch.randn(6, 4)]
    LB.load_balancing_loss(x, 4, 2)
    with pytest.raises(ValueError, match="gate_logits\\[1\\] is \\(5, 4\\)"):
        LB.load_balancing_loss([x[0], torch.randn(5, 4)], 4, 2)
    with pytest.raises(ValueError, match="gate_logits\\[1\\] is \\(6, 4\\) torch.bfloat16"):
        LB.load_balancing_loss([x[0], x[1].bfloat16()], 4, 2)
    with pytest.raises(TypeError, match="gate_logits\\[1\\]"):
        LB.load_balancing_loss([x[0], x[1].tolist()], 4, 2)
    with pytest.raises(ValueError, match="torch.float64 but gate_logits\\[0\\]"):
        LB.load_balancing_loss([x[0], x[1].double()], 4, 2)
    with pytest.raises(TypeError, match="float64"):
        LB.load_balancing_loss([x[0].double(), x[1].double()], 4, 2)
    with pytest.raises(ValueError, match="\\[T, E\\]"):
        LB.load_balancing_loss([x[0].reshape(24), x[1].reshape(24)], 4, 2)
    with pytest.raises(ValueError, match="different devices"):
        LB.load_balancing_loss([x[0], x[1].to("meta")], 4, 2)
    with pytest.raises(ValueError, match="different devices"):
        LB.load_balancing_loss(x, 4, 2, torch.ones(2, 3, device="meta"))
    with pytest.raises(ValueError, match="num_experts=5"):
        LB.load_balancing_loss(x, 5, 2)
    LB.load_balancing_loss(x, 4, 2)


def test_layers_the_kernels_cannot_read_in_place_are_copied_with_gradients():
    # experts not unit-stride (a transposed [E, T] buffer), in some layers or all: the general
    # path copies them, forward and backward, and gives the in-place path's result
    e, k = 8, 2
    base = [torch.randn(40, e) for _ in range(3)]
    transposed = [x.t().contiguous().t() for x in base]
    assert transposed[0].stride() == (1, 40)
    want = run(LB.load_balancing_loss, base, e, k, None)
    for layers in (transposed, [base[0], transposed[1], base[2]]):
        got = run(LB.load_balancing_loss, layers, e, k, None)
        assert torch.equal(got[0], want[0]) and all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


def test_backward_rebuilds_the_table_when_saved_layers_come_back_elsewhere():
    # forward's pointer table serves backward only while the saved layers are where forward read
    # them; a saved-tensor hook that hands back copies (offloading does) moves them
    e, k = 8, 2
    logits = [torch.randn(30, e) for _ in range(3)]
    want = run(LB.load_balancing_loss, logits, e, k, None)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t.clone()):
        got = run(LB.load_balancing_loss, logits, e, k, None)
    assert torch.equal(got[0], want[0]) and all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    # and an in-place change of a saved layer is still caught by autograd's version check
    leaves = [x.clone().requires_grad_() for x in logits]
    layers = [x * 1 for x in leaves]
    loss = LB.load_balancing_loss(layers, e, k)
    layers[1].add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
