"""moe_router eager kernel: transformers' Qwen3MoeTopKRouter bitwise, the conformance cases (near-tie
masks, measured tolerances), the binder (what it binds and what it leaves, with why), the config field."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from veomni_ops.ops.moe_router.cases import HARNESS, decided, rank_map
from veomni_ops.ops.moe_router.kernel import moe_router
from veomni_ops.ops.moe_router.reference import TOLERANCES, specs
from veomni_ops.spec import Tolerance
from veomni_ops.testing.case_check import check_case
from veomni_ops.testing.cases import Builder

transformers = pytest.importorskip("transformers")
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter  # noqa: E402


def qwen3_router(e=12, k=3, h=16, norm=True, dtype=torch.float32):
    cfg = transformers.Qwen3MoeConfig(hidden_size=h, num_experts=e, num_experts_per_tok=k, norm_topk_prob=norm)
    r = Qwen3MoeTopKRouter(cfg).to(dtype)
    nn.init.normal_(r.weight, generator=torch.Generator().manual_seed(0))
    return r


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("norm", [True, False])
def test_eager_is_transformers_router_bitwise(dtype, norm):
    r = qwen3_router(norm=norm, dtype=dtype)
    h = torch.randn(4, 7, 16, dtype=dtype)
    logits, want_w, want_i = r(h)
    w, i = moe_router(logits, r.top_k, r.norm_topk_prob)
    assert torch.equal(w, want_w) and torch.equal(i, want_i) and w.dtype == dtype


def test_no_token():
    x = torch.zeros(0, 8, requires_grad=True)
    w, i = moe_router(x, 2, True)
    assert w.shape == i.shape == (0, 2) and i.dtype == torch.int64
    w.sum().backward()
    assert x.grad is not None and x.grad.shape == (0, 8)


def test_input_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"moe_router: top_k must be an int in \[1, E=4\], got 0"):
        moe_router(torch.randn(3, 4), 0, True)
    with pytest.raises(ValueError, match=r"moe_router: logits must be 2-D|\[T, E\]"):
        moe_router(torch.randn(4), 1, True)
    with pytest.raises(TypeError, match="normalize must be a bool"):
        moe_router(torch.randn(3, 4), 1, None)


def test_rank_map_and_near_ties():
    assert rank_map(torch.tensor([[2, 0]]), 4).tolist() == [[2, 0, 1, 0]]
    x = torch.tensor([[0.0, 1.0, 1.0, -2.0], [0.0, 1.0, 1.0 - 1e-7, -2.0], [0.0, 1.0, 0.5, -2.0],
                      [1e4, 0.0, 0.0, 0.0]])
    # an exact tie, a tie within float32 rounding, none, and a row whose top-2 after the first are zeros
    assert decided(x, 2).flatten().tolist() == [False, False, True, False]
    assert decided(x, 1).flatten().tolist() == [False, False, True, True]  # rows 0, 1: a tie for the first place


def test_cases_mask_ranks_only_where_a_case_says_so():
    """Tie-free logits leave every token's ranks compared; the peaked cases exclude exactly their
    ±1e4 tokens (whose probabilities after the first underflow to equal zeros)."""
    for size in ("small", "full"):
        for case in HARNESS.cases("standard", size):
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                inp = case.build(Builder(0, dtype, "cpu"))
                kept = decided(inp["logits"], inp["top_k"]).flatten()
                t = inp["logits"].shape[0]
                if case.name.startswith("peaked"):
                    step = 3 if "12tok" in case.name else (2 if "6tok" in case.name else 4)
                    want = torch.arange(t) % step != 0
                    if inp["top_k"] == 1:
                        want[:] = True
                    assert torch.equal(kept, want), (case.name, dtype)
                else:
                    assert bool(kept.all()), (case.name, dtype, int((~kept).sum()))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_tolerances_are_about_four_times_eagers_measured_error(dtype):
    """The measurement the spec's tolerances come from (ops/moe_router/reference.py), repeated:
    eager in ``dtype`` against float64, in units of the kit's measure at atol = rtol = 1."""
    spec = dataclasses.replace(specs()[0], tolerances={dtype: Tolerance(1.0, 1.0)})
    worst = 0.0
    for i, case in enumerate(HARNESS.cases("standard", "small")):
        res = check_case(moe_router, spec, HARNESS, "standard", case, dtype, "cpu", seed=i)
        assert res.status == "pass", (case.name, res.message)
        worst = max([worst] + [c.ratio for c in res.comparisons if c.name != "indices"])
        assert all(c.ratio == 0 for c in res.comparisons if c.name == "indices"), case.name
    tol = TOLERANCES[dtype]
    assert tol.atol == tol.rtol and worst <= tol.atol / 2, (worst, tol)


def test_conformance_of_eager_itself():
    from veomni_ops.testing.runner import check_kernel

    results = check_kernel(moe_router, specs()[0], device="cpu", size="small")
    assert [r for r in results if r.status != "pass"] == []
    assert len(results) == 4 * 10


# ------------------------------------------------------------------------------------ binder


def _places(model):
    from veomni_ops.binding.place import Survey
    from veomni_ops.ops.moe_router.binder import BINDER

    return [p for path, m in model.named_modules() for p in BINDER.find(path or "router", m, Survey(model))]


def test_binds_qwen3_routers_and_the_bound_forward_is_the_same():
    _assert_binds_and_computes_the_same(qwen3_router())


def _assert_binds_and_computes_the_same(r: nn.Module) -> None:
    """``r`` is a router place (nothing left), and its bound forward returns what its own forward does."""
    from veomni_ops.binding.place import Edits
    from veomni_ops.ops.moe_router.binder import BINDER

    (place,) = _places(r)
    assert place.left is None and place.op == "moe_router"
    edits = Edits()
    BINDER.bind(place, moe_router, edits)
    module, forward = edits.forwards[0]
    h = torch.randn(2, 5, 16)
    assert all(torch.equal(a, b) for a, b in zip(forward(module, h), r(h)))


def test_same_code_in_another_family_binds():
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter

    cfg = transformers.Qwen2MoeConfig(hidden_size=16, num_experts=8, num_experts_per_tok=2)
    (place,) = _places(Qwen2MoeTopKRouter(cfg))
    assert place.left is None


class _VeOmniStyleRouter(Qwen3MoeTopKRouter):
    """VeOmni's generated Qwen3-MoE router: transformers' computation, torch.nn.functional spelled out."""

    def forward(self, hidden_states: torch.Tensor):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        # raw logits for the load-balancing loss; the softmax only picks the experts
        router_logits = torch.nn.functional.linear(hidden_states, self.weight)
        routing_weights = torch.nn.functional.softmax(router_logits, dtype=torch.float, dim=-1)
        router_top_value, router_indices = torch.topk(routing_weights, self.top_k, dim=-1)
        if self.norm_topk_prob:
            router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
        router_top_value = router_top_value.to(router_logits.dtype)
        return router_logits, router_top_value, router_indices


def test_veomnis_generated_router_binds_and_computes_the_same():
    r = _VeOmniStyleRouter(transformers.Qwen3MoeConfig(hidden_size=16, num_experts=12, num_experts_per_tok=3))
    nn.init.normal_(r.weight, generator=torch.Generator().manual_seed(0))
    _assert_binds_and_computes_the_same(r)


def test_routers_with_other_code_are_left_with_why():
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

    mixtral = MixtralTopKRouter(transformers.MixtralConfig(hidden_size=16, num_local_experts=8, num_experts_per_tok=2))
    mixtral.norm_topk_prob = True  # even with the attribute, its forward differs (float32 weights, always renormalised)
    (place,) = _places(mixtral)
    assert "MixtralTopKRouter.forward) is not the contract's router code" in place.left

    class NoisyRouter(Qwen3MoeTopKRouter):
        def forward(self, hidden_states):
            return super().forward(hidden_states + 0.01 * torch.randn_like(hidden_states))

    (place,) = _places(NoisyRouter(qwen3_router().config if hasattr(qwen3_router(), "config") else
                                   transformers.Qwen3MoeConfig(hidden_size=16, num_experts=12,
                                                               num_experts_per_tok=3)))
    assert "NoisyRouter.forward) is not the contract's router code" in place.left

    biased = qwen3_router()
    biased.bias = nn.Parameter(torch.zeros(12))
    (place,) = _places(biased)
    assert place.left.startswith("it has a bias")

    odd = qwen3_router()
    odd.norm_topk_prob = 1
    (place,) = _places(odd)
    assert "norm_topk_prob is 1, not a bool" in place.left


def test_modules_without_router_attributes_are_not_places():
    assert _places(nn.Linear(4, 8)) == []
    lin = nn.Linear(4, 8)
    lin.top_k = 2  # no num_experts
    assert _places(lin) == []


# ------------------------------------------------------------------------------------ config


def test_config_field_and_veomni_defaults():
    from veomni_ops import OpsConfig
    from veomni_ops.veomni import NOT_IN_VEOMNI, VEOMNI_DEFAULTS

    assert OpsConfig().moe_router_implementation == "auto"
    assert OpsConfig.from_dict({"moe_router_implementation": "triton"}).for_op("moe_router") == "triton"
    assert "moe_router_implementation" in NOT_IN_VEOMNI
    assert VEOMNI_DEFAULTS["moe_router_implementation"] == "eager"
    assert OpsConfig.veomni_defaults().moe_router_implementation == "eager"


def test_bench_times_forward_and_backward_of_the_weights_only():
    """The bench's fwd+bwd differentiates the outputs that have a gradient (the weights, not the indices)."""
    import veomni_ops.bench as B
    from veomni_ops.bench.loop import _closures

    w = B.Workload("t", "moe_router", "standard", "float32", dict(tokens=16, experts=8, top_k=2, normalize=1), "bytes",
                   "moe_router")
    inputs, diff = B.build_inputs(w, "cpu")
    assert diff == ("logits",) and inputs["normalize"] is True
    passes = _closures(moe_router, inputs, diff, HARNESS, torch.device("cpu"))
    (grad,) = passes["fwd+bwd"][0]()
    assert grad.shape == (16, 8) and torch.isfinite(grad).all()
    assert w.amount("fwd+bwd") > w.amount("fwd") > 0
