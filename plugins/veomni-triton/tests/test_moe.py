"""MoE experts Triton kernel vs a float64 reference (and the core's eager loop), fwd and bwd.

Shapes are tiny (Triton's CPU interpreter is slow); the interpreter's tile table (32x64x32)
still gives several tiles per expert, partial tiles, and uneven N/K edges at I=48, and one
case forces 16-wide tiles so that every kernel loops and masks on every edge.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_close, core_kernels
from veomni_triton.kernels import moe as M
from veomni_triton.kernels.moe import GemmConfig

F32, BF16 = torch.float32, torch.bfloat16
OP = "moe_experts"


def reference(x, idx, w, gate_up, down):
    """The contract in float64, route by route; routes with an expert outside [0, E) are skipped."""
    num_experts = gate_up.shape[0]
    x, w, gate_up, down = x.double(), w.double(), gate_up.double(), down.double()
    out = torch.zeros_like(x)
    for k in range(idx.shape[1]):
        e = idx[:, k]
        valid = (e >= 0) & (e < num_experts)
        ec = e.clamp(0, num_experts - 1)
        gu = torch.einsum("tjh,th->tj", gate_up[ec], x)
        g, u = gu.chunk(2, dim=-1)
        y = torch.einsum("thi,ti->th", down[ec], F.silu(g) * u)
        out = out + torch.where(valid[:, None], w[:, k, None] * y, torch.zeros_like(y))
    return out


def make_inputs(t, h, inter, e, k, dtype, routing="random"):
    x = torch.randn(t, h, dtype=dtype)
    if routing == "random":
        idx = torch.stack([torch.randperm(e)[:k] for _ in range(t)]) if t else torch.empty((0, k), dtype=torch.long)
    elif routing == "one_expert":  # every route to expert 2: all others empty, every token lists it K times
        idx = torch.full((t, k), 2, dtype=torch.long)
    elif routing == "skewed_dup":  # two hot experts, duplicates, several empty experts
        idx = torch.randint(0, 2, (t, k)) * 3
    elif routing == "sentinel":  # expert-parallel sentinel E (and -1) on some routes: skipped
        idx = torch.stack([torch.randperm(e)[:k] for _ in range(t)])
        idx[::3, 0] = e
        idx[1::5, -1] = -1
    else:
        raise ValueError(routing)
    w = torch.rand(t, k, dtype=dtype)
    gate_up = (torch.randn(e, 2 * inter, h) * h**-0.5).to(dtype)
    down = (torch.randn(e, h, inter) * inter**-0.5).to(dtype)
    return x, idx, w, gate_up, down


def run(fn, x, idx, w, gate_up, down, grad, cast=None):
    leaves = [t.detach().to(cast or t.dtype).requires_grad_() for t in (x, w, gate_up, down)]
    out = fn(leaves[0], idx, leaves[1], leaves[2], leaves[3])
    out.backward(grad.to(out.dtype))
    return [out.detach()] + [t.grad for t in leaves]


NAMES = ("out", "d_hidden", "d_top_k_weights", "d_gate_up_proj", "d_down_proj")


def check_against(ours, ref, what, rows_per_expert, inter):
    for name, a, b in zip(NAMES, ours, ref):
        # reductions: weight gradients sum one term per routed token of the expert, the router
        # weights' gradient <y, grad_out> one per intermediate channel; their absolute error
        # grows like the square root of the number of terms
        scale = {"d_gate_up_proj": rows_per_expert**0.5, "d_down_proj": rows_per_expert**0.5,
                 "d_top_k_weights": inter**0.5 / 2}.get(name, 1.0)
        assert_close(a, b, OP, f"{what} {name}", scale=max(1.0, scale))


@pytest.mark.parametrize(
    "dtype,routing",
    [(F32, "random"), (BF16, "random"), (F32, "one_expert"), (BF16, "skewed_dup"), (F32, "sentinel")],
)
def test_matches_float64_reference(dtype, routing):
    t, h, inter, e, k = 37, 64, 48, 8, 4
    args = make_inputs(t, h, inter, e, k, dtype, routing)
    grad = torch.randn(t, h, dtype=dtype)
    ours = run(M.moe_experts, *args, grad)
    ref = run(reference, *args, grad, cast=torch.float64)
    hits = torch.bincount(args[1][(args[1] >= 0) & (args[1] < e)], minlength=e)
    check_against(ours, ref, f"{routing}/{dtype}", int(hits.max()), inter)
    if routing == "one_expert":
        # experts without tokens get exactly zero weight gradient
        assert ours[3][torch.arange(e) != 2].abs().max() == 0
        assert ours[4][torch.arange(e) != 2].abs().max() == 0
    if routing == "sentinel":
        skipped = (args[1] < 0) | (args[1] >= e)
        assert skipped.any() and (ours[2][skipped] == 0).all()
    if dtype == BF16:
        # deterministic: no atomics anywhere, so a second run is bitwise identical
        again = run(M.moe_experts, *args, grad)
        for name, a, b in zip(NAMES, ours, again):
            assert torch.equal(a, b), f"{name} differs between two identical runs"


def test_matches_core_eager():
    core = core_kernels("moe")
    t, h, inter, e, k = 37, 64, 48, 8, 2
    args = make_inputs(t, h, inter, e, k, F32)
    grad = torch.randn(t, h)
    ours = run(M.moe_experts, *args, grad)
    eager = run(core.moe_experts_eager, *args, grad)
    for name, a, b in zip(NAMES, ours, eager):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=lambda m, n=name: f"{n} vs core eager: {m}")


def test_odd_sizes_small_tiles_strided_input():
    # H=40, I=24 are multiples of no tile; 16-wide tiles make every GEMM loop over K and N,
    # several M-tiles per expert; hidden_states is a column slice (row stride 56 != H)
    t, h, inter, e, k = 29, 40, 24, 5, 3
    x, idx, w, gate_up, down = make_inputs(t, h, inter, e, k, F32)
    wide = torch.randn(t, 56)
    wide[:, 8:48] = x
    x_strided = wide[:, 8:48]
    assert x_strided.stride(0) == 56
    grad = torch.randn(t, h)
    small = GemmConfig(16, 16, 16, 4, 1)
    with M.override_configs(gate_up=small, down=small, dh=small, dx=small, wgrad=small):
        ours = run(M.moe_experts, x_strided, idx, w, gate_up, down, grad)
    ref = run(reference, x, idx, w, gate_up, down, grad, cast=torch.float64)
    check_against(ours, ref, "odd sizes", t * k // e + 4, inter)
    # the two weight gradients with their own tiles (one wider than a whole weight matrix)
    with M.override_configs(wgrad_down=GemmConfig(16, 32, 16, 4, 1), wgrad_gate_up=GemmConfig(64, 64, 16, 4, 1)):
        split = run(M.moe_experts, x_strided, idx, w, gate_up, down, grad)
    check_against(split, ref, "odd sizes, per-wgrad tiles", t * k // e + 4, inter)
    with pytest.raises(ValueError, match="unknown moe kernel"):
        with M.override_configs(wgrad_up=small):
            pass


@pytest.mark.parametrize("dtype,routing", [(BF16, "random"), (BF16, "skewed_dup"), (torch.float16, "sentinel")])
@pytest.mark.parametrize("kinds", [("wgrad",), ("dh",), ("dh", "wgrad")])
def test_backward_through_tma(dtype, routing, kinds):
    # GemmConfig(tma=True): grad_out / x rows copied into sorted-row order, operands read through
    # tensor descriptors; 16-row blocks, so experts end inside a block and blocks span two experts
    t, h, inter, e, k = 40, 32, 48, 6, 2
    x, idx, w, gate_up, down = make_inputs(t, h, inter, e, k, dtype, routing)
    grad = torch.randn(t, h)
    cfg = GemmConfig(32, 16, 16, 4, 1)
    with M.override_configs(**{kind: replace(cfg, tma=True) for kind in kinds}):
        ours = run(M.moe_experts, x, idx, w, gate_up, down, grad)
    ref = run(reference, x, idx, w, gate_up, down, grad, cast=torch.float64)
    check_against(ours, ref, f"{dtype} {routing} tma {kinds}", t * k / e, inter)
    with M.override_configs(**{kind: cfg for kind in kinds}):
        gathering = run(M.moe_experts, x, idx, w, gate_up, down, grad)
    for name, a, b in zip(NAMES, ours, gathering):  # the same sums in the same order
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"{name}: the TMA path differs from the gathering one")


@pytest.mark.parametrize("block_m", [16, 1])  # 1: 81 tile ids, more than one program of the map kernel
def test_tile_map_covers_every_row_once(block_m):
    # the per-tile (expert, first row) table the GEMMs read, against a direct computation
    counts = torch.tensor([0, 5, 0, 0, 33, 1, 16, 0, 17])
    e = counts.numel()
    offs = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    tiles = M._Tiles(offs, int(counts.sum()), e)
    tile_expert, tile_start, n = tiles.get(block_m)
    expected = [(ex, int(offs[ex]) + j * block_m) for ex in range(e) for j in range(-(-int(counts[ex]) // block_m))]
    assert n >= len(expected)
    got = list(zip(tile_expert.tolist(), tile_start.tolist()))
    assert got[: len(expected)] == expected
    assert all(ex >= e for ex, _ in got[len(expected):]), "tile ids past the last tile must have no expert"


def test_partial_requires_grad_and_no_grad():
    t, h, inter, e, k = 16, 32, 16, 4, 2
    x, idx, w, gate_up, down = make_inputs(t, h, inter, e, k, F32)
    x.requires_grad_()
    out = M.moe_experts(x, idx, w, gate_up, down)  # frozen experts and router weights
    out.sum().backward()
    x64 = x.detach().double().requires_grad_()
    reference(x64, idx, w, gate_up, down).sum().backward()
    assert_close(x.grad, x64.grad, OP, "d_hidden (weights frozen)")
    with torch.no_grad():
        assert_close(M.moe_experts(x, idx, w, gate_up, down), reference(x, idx, w, gate_up, down), OP, "no_grad out")


def test_only_down_proj_requires_grad():
    # backward's dh GEMM then runs only to recompute the forward's silu(g)*u (not kept), which
    # d down_proj needs
    t, h, inter, e, k = 24, 32, 48, 4, 2
    x, idx, w, gate_up, down = make_inputs(t, h, inter, e, k, F32)
    down.requires_grad_()
    grad = torch.randn(t, h)
    M.moe_experts(x, idx, w, gate_up, down).backward(grad)
    d64 = down.detach().double().requires_grad_()
    reference(x, idx, w, gate_up, d64).backward(grad.double())
    assert_close(down.grad, d64.grad, OP, "d_down_proj (only it requires grad)", scale=(t * k / e) ** 0.5)


def test_forward_keeps_gate_up_not_its_product():
    # what autograd holds per layer between forward and backward: the inputs, [g | u], the
    # routing order; not hw = w * silu(g) * u (T*K*I elements), which backward recomputes
    t, h, inter, e, k = 16, 32, 48, 4, 2
    x, idx, w, gate_up, down = make_inputs(t, h, inter, e, k, F32)
    leaves = [p.requires_grad_() for p in (x, w, gate_up, down)]
    shapes = []

    def pack(saved):
        shapes.append(tuple(saved.shape))
        return saved

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved):
        out = M.moe_experts(x, idx, w, gate_up, down)
    assert (t * k, 2 * inter) in shapes, shapes
    assert (t * k, inter) not in shapes, f"the forward kept a [T*K, I] tensor: {shapes}"
    beyond_inputs = [s for s in shapes if s not in {tuple(p.shape) for p in leaves} | {tuple(idx.shape)}]
    assert sorted(beyond_inputs) == sorted([(t * k, 2 * inter), (t * k,), (e + 1,)]), beyond_inputs
    out.sum().backward()
    assert all(p.grad is not None for p in leaves)


def test_empty_batch():
    x, idx, w, gate_up, down = make_inputs(0, 32, 16, 4, 2, F32)
    x.requires_grad_()
    gate_up.requires_grad_()
    out = M.moe_experts(x, idx, w, gate_up, down)
    assert out.shape == (0, 32)
    out.sum().backward()
    assert gate_up.grad is not None and gate_up.grad.abs().max() == 0


def test_compile_fullgraph():
    t, h, inter, e, k = 8, 32, 16, 2, 2
    args = make_inputs(t, h, inter, e, k, F32)
    grad = torch.randn(t, h)

    def layer(x, idx, w, gate_up, down):
        return M.moe_experts(x * 2.0, idx, w, gate_up, down) + 1.0

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    got = run(compiled, *args, grad)
    want = run(layer, *args, grad)
    for name, a, b in zip(NAMES, got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=lambda m, n=name: f"{n} compiled vs eager: {m}")


def test_bad_inputs_are_explained():
    x, idx, w, gate_up, down = make_inputs(4, 32, 16, 4, 2, F32)
    with pytest.raises(TypeError, match="cast the activations or the weights"):
        M.moe_experts(x, idx, w, gate_up.to(BF16), down)
    with pytest.raises(ValueError, match=r"\[E, 2I, H\]"):
        M.moe_experts(x, idx, w, gate_up[:, :-1], down)
    with pytest.raises(ValueError, match="hidden_states must be"):
        M.moe_experts(x[:, :16], idx, w, gate_up, down)
    with pytest.raises(ValueError, match=r"both be \[T, K\]"):
        M.moe_experts(x, idx, w[:, :1], gate_up, down)
    with pytest.raises(TypeError, match="int64 or int32"):
        M.moe_experts(x, idx.float(), w, gate_up, down)


@pytest.mark.parametrize("bad", [9, -2, 1000])
def test_expert_index_outside_the_sentinels_is_an_error_naming_it(bad):
    # E = 8: -1 and 8 route nowhere (covered above); anything else outside [0, 8) is a routing
    # bug, refused with the index and E -- before, it was skipped silently like a sentinel.
    t, h, inter, e, k = 5, 16, 16, 8, 2
    x, idx, w, gate_up, down = make_inputs(t, h, inter, e, k, F32, "sentinel")
    idx[3, 1] = bad
    with pytest.raises(ValueError, match=rf"moe_experts \(triton\): top_k_index holds {bad}, .*E = 8"):
        M.moe_experts(x, idx, w, gate_up, down)


def test_expert_index_rule_under_compile_asserts_on_the_device():
    # While torch.compile traces, the indices cannot be read on the host: the rule becomes a
    # device-side assertion (torch._assert_async), which raises on the CPU.
    t, h, inter, e, k = 4, 16, 16, 4, 2
    x, idx, w, gate_up, down = make_inputs(t, h, inter, e, k, F32, "random")
    fn = torch.compile(M.moe_experts, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(fn(x, idx, w, gate_up, down), M.moe_experts(x, idx, w, gate_up, down))
    idx[0, 0] = -3
    with pytest.raises(RuntimeError, match=r"top_k_index holds an index, outside \[0, 4\)"):
        fn(x, idx, w, gate_up, down)
