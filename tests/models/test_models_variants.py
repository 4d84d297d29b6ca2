"""Variants: a kernel that lacks the variant a model needs is refused by name, passed over by auto."""

from __future__ import annotations

import pytest
import torch
import veomni_ops
from models_support import ALL_EAGER, batch, build, pair
from veomni_ops import KernelSpec, OpsConfig, ResolutionError
from veomni_ops.binding import BindingError

_K = "veomni_ops.kernels"


@pytest.fixture(scope="module")
def standard_only_registry(plugin, registry_with):
    """eager + ``stdonly``: an rms_norm kernel with the standard variant only, and a rotary
    kernel with the full variant only, both above every core kernel in priority."""
    stdonly = plugin(
        "stdonly",
        rms_norm=[KernelSpec(name="stdonly", op="rms_norm", variant="standard",
                             factory=f"{_K}.rms_norm:rms_norm_standard", priority=100)],
        rotary=[KernelSpec(name="stdonly", op="rotary", variant="full",
                           factory=f"{_K}.rotary:apply_rotary", priority=100)],
    )
    return registry_with(("stdonly", stdonly))


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5"])
def test_standard_norm_kernel_refused_on_offset_model(name, standard_only_registry):
    model = build(name)
    with pytest.raises(ResolutionError) as ei:
        veomni_ops.apply(model, {"rms_norm_implementation": "stdonly"}, registry=standard_only_registry, device="cpu")
    msg = str(ei.value)
    assert "rms_norm_implementation='stdonly'" in msg
    assert "kernel 'stdonly' provides variant(s) standard of rms_norm, but this needs offset" in msg
    assert "Usable here for rms_norm/offset: eager" in msg
    assert not hasattr(model, "veomni_ops_binding")  # nothing half-bound


def test_full_rotary_kernel_refused_on_partial_rotary_model(standard_only_registry):
    with pytest.raises(ResolutionError, match="provides variant\\(s\\) full of rotary, but this needs partial"):
        veomni_ops.apply(build("qwen3_next"), {"rotary_pos_emb_implementation": "stdonly"},
                         registry=standard_only_registry, device="cpu")


def test_auto_passes_over_kernel_without_the_variant(standard_only_registry):
    """auto on an offset/partial model takes the next kernel that has the variant (eager);
    on a standard/full model it takes the higher-priority one. Both plans say which and why."""
    ref, model = pair("qwen3_next")
    binding = veomni_ops.apply(model, {}, registry=standard_only_registry, device="cpu")
    norm = binding.plan.get("rms_norm", "offset")
    assert norm.kernel == "eager" and norm.requested == "auto"
    assert "auto: highest priority usable here (priority 0)" in norm.reason
    assert binding.plan.get("rms_norm", "standard") is None
    assert binding.plan.get("rotary", "partial").kernel == "eager"
    assert {v for _, op, v, k in binding.bound if op == "rms_norm"} == {"offset"}
    table = binding.plan.table()
    assert "rms_norm" in table and "offset" in table
    # and it is right
    b = batch()
    torch.testing.assert_close(model(**b).loss, ref(**b).loss, atol=1e-5, rtol=1e-5)

    std = veomni_ops.apply(build("qwen3"), {}, registry=standard_only_registry, device="cpu")
    e = std.plan.get("rms_norm", "standard")
    assert e.kernel == "stdonly" and "priority 100" in e.reason and e.distribution == "stdonly"
    assert std.plan.get("rotary", "full").kernel == "stdonly"


def test_plan_without_the_variant_is_refused_at_bind_and_nothing_is_bound(standard_only_registry):
    """A plan with a standard norm kernel but nothing for offset: binding it into an offset
    model raises instead of putting w*x̂ where x̂*(1+w) belongs, and leaves the model as it
    was (not half bound: the experts and MLPs come before the first norm in module order)."""
    from veomni_ops.binding import needs_of as _needs
    from veomni_ops.binding import survey
    from veomni_ops.resolve import resolve

    model = build("qwen3_next")
    needs = _needs(survey(model))
    needs["rms_norm"] = ["standard"]
    plan = resolve(OpsConfig(**ALL_EAGER), "cpu", needs=needs, registry=standard_only_registry, dtype="float32")
    assert plan.get("rms_norm", "offset") is None and plan.get("moe_experts", "standard") is not None
    with pytest.raises(BindingError, match="no kernel for rms_norm/offset"):
        veomni_ops.apply(model, plan)
    patched = [n for n, m in model.named_modules() if "forward" in m.__dict__]
    assert patched == [], f"a failed apply left these modules patched: {patched}"
    assert not hasattr(model, "veomni_ops_binding")


def test_explicit_standard_kernel_binds_where_it_fits(standard_only_registry):
    ref, model = pair("qwen3")
    binding = veomni_ops.apply(model, OpsConfig(rms_norm_implementation="stdonly"), registry=standard_only_registry,
                               device="cpu")
    e = binding.plan.get("rms_norm", "standard")
    assert e.kernel == "stdonly" and e.reason == "requested by name"
    b = batch()
    torch.testing.assert_close(model(**b).loss, ref(**b).loss, atol=1e-5, rtol=1e-5)
