"""MoE top-k router Triton kernel vs the float64 reference (the conformance kit's cases), fwd and bwd,
its tie rule, its limits, and transformers' Qwen3MoeTopKRouter bound to it."""

from __future__ import annotations

import pytest
import torch
import veomni_triton.specs as specs
from _helpers import DTYPES, assert_close
from veomni_ops.ops.moe_router.cases import tie_free_logits
from veomni_ops.testing import backend_tests as kit
from veomni_ops.testing.cases import Builder
from veomni_ops.testing.runner import check_kernel
from veomni_triton.kernels.router import MAX_EXPERTS, MAX_TOP_K, moe_router

OP = "moe_router"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_conformance_cases(device, dtype):
    """Every small case of the kit: weights and the logits' gradient within the spec's (measured)
    tolerance of float64, indices exact wherever the reference's top-k is not a near-tie."""
    spec = kit.spec_for(specs, OP, name="triton")
    results = check_kernel(moe_router, spec, device=device, size="small", dtypes=[dtype])
    bad = [f"{r.case} {r.dtype}: {r.status} {r.message}" for r in results if r.status != "pass"]
    assert not bad, "\n".join(bad)
    assert len(results) == 10


def _float64_grad(logits: torch.Tensor, k: int, normalize: bool, g: torch.Tensor):
    x = logits.detach().double().requires_grad_()
    w, i = torch.topk(torch.softmax(x, -1), k, dim=-1)
    if normalize:
        w = w / w.sum(-1, keepdim=True)
    (w * g).sum().backward()
    return w, i, x.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("normalize", [True, False])
def test_backward_matches_float64_autograd(device, dtype, normalize):
    t, e, k = 37, 24, 5
    logits = tie_free_logits(Builder(3, dtype, device), t, e)  # no two equal values in a row, in any dtype
    x = logits.clone().requires_grad_()
    w, i = moe_router(x, k, normalize)
    g = torch.randn(t, k, device=device, dtype=torch.float64)
    (w.double() * g).sum().backward()
    w64, i64, dx64 = _float64_grad(logits, k, normalize, g)
    assert torch.equal(i, i64) and i.dtype == torch.int64 and w.dtype == dtype
    assert_close(w, w64, OP, "weights")
    assert_close(x.grad, dx64, OP, "grad logits")
    if normalize:
        assert torch.allclose(w.double().sum(-1), torch.ones(t, dtype=torch.float64, device=device), atol=1e-2)


def test_ties_take_the_lowest_index_first(device):
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0, 2.0], [-1e4, 1e4, -1e4, -1e4, -1e4]], device=device)
    w, i = moe_router(logits, 4, False)
    assert i.tolist() == [[1, 2, 4, 3], [1, 0, 2, 3]]
    assert torch.isfinite(w).all() and w[1].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_a_row_of_nan_keeps_its_indices_in_range(device):
    """A NaN row (a diverged router) matches no column in the arg-max rounds: its indices stay within
    [0, E), so the experts kernel that reads them never goes out of bounds (the row's weights are not
    defined: the loss is NaN either way); the other rows are untouched."""
    logits = torch.randn(3, 6, device=device)
    logits[1] = float("nan")
    w, i = moe_router(logits, 2, True)
    assert ((i >= 0) & (i < 6)).all()
    ok, ref = moe_router(logits[[0, 2]], 2, True)
    assert torch.equal(w[[0, 2]], ok) and torch.equal(i[[0, 2]], ref)


def test_no_token_and_no_grad(device):
    x = torch.randn(0, 8, device=device, requires_grad=True)
    w, i = moe_router(x, 2, True)
    assert w.shape == (0, 2) and i.shape == (0, 2) and i.dtype == torch.int64
    w.sum().backward()
    assert x.grad is not None and x.grad.shape == (0, 8)
    with torch.no_grad():
        w, i = moe_router(torch.randn(3, 8, device=device), 2, True)
    assert not w.requires_grad and w.shape == (3, 2)


def test_limits_are_refused_with_the_fix(device):
    assert (MAX_EXPERTS, MAX_TOP_K) == (512, 16)
    with pytest.raises(ValueError, match=r"moe_router \(triton\): logits has E=513 experts; this kernel takes at most "
                                         r"512.*moe_router_implementation: eager"):
        moe_router(torch.randn(2, 513, device=device), 2, True)
    with pytest.raises(ValueError, match=r"top_k=17; this kernel takes at most 16"):
        moe_router(torch.randn(2, 64, device=device), 17, True)
    with pytest.raises(ValueError, match=r"top_k must be an int in \[1, E=4\], got 5"):
        moe_router(torch.randn(2, 4, device=device), 5, True)
    with pytest.raises(TypeError, match="normalize must be a bool"):
        moe_router(torch.randn(2, 4, device=device), 2, 1)
    with pytest.raises(ValueError, match=r"logits must be .*\[T, E\]|\[T, E\]"):
        moe_router(torch.randn(2, 3, 4, device=device), 2, True)
    with pytest.raises(TypeError, match="eager"):
        moe_router(torch.randn(2, 4, device=device, dtype=torch.float64), 2, True)


def test_auto_keeps_eager_and_triton_is_taken_by_name():
    from veomni_ops import OpsConfig, build_registry, parse_device, resolve

    reg = build_registry()
    dev = parse_device("cuda:9.0")
    for compile_mode in (False, True):
        auto = resolve(OpsConfig(), dev, registry=reg, load=False, compile=compile_mode).get(OP, "standard")
        assert auto is not None and auto.kernel == "eager", auto
    named = resolve(OpsConfig(moe_router_implementation="triton"), dev, registry=reg, load=False).get(OP, "standard")
    assert named is not None and named.kernel == "triton" and named.distribution == "veomni-triton"


def test_binds_qwen3_moe_router_to_the_kernel(device):
    """transformers' Qwen3MoeTopKRouter with its forward replaced: the same outputs and gradients."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter
    from veomni_ops.binding.place import Edits, Survey
    from veomni_ops.ops.moe_router.binder import BINDER

    cfg = transformers.Qwen3MoeConfig(hidden_size=32, num_experts=12, num_experts_per_tok=3, norm_topk_prob=True)
    router = Qwen3MoeTopKRouter(cfg).to(device)
    torch.nn.init.normal_(router.weight)
    places = BINDER.find("gate", router, Survey(router))
    assert len(places) == 1 and places[0].left is None
    edits = Edits()
    BINDER.bind(places[0], moe_router, edits)
    module, forward = edits.forwards[0]
    h = torch.randn(2, 5, 32, device=device, requires_grad=True)
    want = router(h)
    got = forward(module, h)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    assert_close(got[1], want[1].double(), OP, "weights")
    g = torch.randn_like(want[1])
    (dh_want,) = torch.autograd.grad((want[1] * g).sum(), h)
    (dh_got,) = torch.autograd.grad((got[1] * g).sum(), h)
    assert_close(dh_got, dh_want.double(), OP, "grad hidden", scale=float(dh_want.abs().max()))
