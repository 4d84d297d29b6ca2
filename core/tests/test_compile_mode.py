"""Compile mode: resolution takes only supports_compile kernels, plans print the mode, and the
conformance kit verifies a supports_compile claim for real (fullgraph, forward and backward)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import veomni_ops
from veomni_ops import KernelSpec, hookimpl
from veomni_ops.backends import reference
from veomni_ops.discovery import build_registry
from veomni_ops.testing.conformance import ConformanceFailure, check_compiles


def breaks_graph(gate, up):
    if float(gate.sum()) > 1e30:  # a host sync on data: dynamo cannot trace this fullgraph
        return gate
    return torch.nn.functional.silu(gate) * up


def traces(gate, up):
    return torch.nn.functional.silu(gate) * up


def _registry():
    mod = types.ModuleType("compile_probe_specs")
    sys.modules["compile_probe_specs"] = mod

    @hookimpl
    def swiglu():
        return [
            KernelSpec(name="liar", op="swiglu", variant="standard", factory=f"{__name__}:breaks_graph",
                       supports_compile=True, priority=60, dtypes=("float32",)),
            KernelSpec(name="honest", op="swiglu", variant="standard", factory=f"{__name__}:traces",
                       supports_compile=True, priority=20, dtypes=("float32",)),
            KernelSpec(name="opaque", op="swiglu", variant="standard", factory=f"{__name__}:traces",
                       supports_compile=False, priority=70, dtypes=("float32",)),
        ]

    mod.swiglu = swiglu
    return build_registry(modules=[("eager", reference), ("probe", mod)], include_entry_points=False, env={})


def test_auto_in_compile_mode_passes_over_kernels_that_do_not_compile():
    reg = _registry()
    eager_plan = veomni_ops.resolve({}, "cpu", needs={"swiglu": ["standard"]}, registry=reg)
    assert eager_plan.get("swiglu", "standard").kernel == "opaque"
    assert "mode eager" in eager_plan.table()
    plan = veomni_ops.resolve({}, "cpu", needs={"swiglu": ["standard"]}, registry=reg, compile=True)
    e = plan.get("swiglu", "standard")
    assert e.kernel == "liar"  # the claim is what resolution reads; the kit is what checks it
    assert "opaque (does not run under torch.compile" in e.reason
    assert "mode compile" in plan.table() and plan.to_dict()["mode"] == "compile"


def test_named_kernel_that_does_not_compile_is_refused_in_compile_mode():
    reg = _registry()
    with pytest.raises(veomni_ops.ResolutionError) as ei:
        veomni_ops.resolve({"swiglu_mlp_implementation": "opaque"}, "cpu", needs={"swiglu": ["standard"]},
                           registry=reg, compile=True)
    msg = str(ei.value)
    assert "supports_compile=False" in msg and "compile mode" in msg
    assert "liar" in msg and "honest" in msg  # what can be had instead


def test_kit_catches_a_false_supports_compile_claim():
    reg = _registry()
    with pytest.raises(ConformanceFailure, match="supports_compile=True but torch.compile"):
        check_compiles(reg, "swiglu", "standard", "liar")
    assert check_compiles(reg, "swiglu", "standard", "honest") is None
    assert "declares supports_compile=False" in check_compiles(reg, "swiglu", "standard", "opaque")


@pytest.mark.parametrize("op", ["rms_norm", "rotary", "swiglu", "attention", "load_balancing_loss"])
def test_kit_verifies_the_reference_claims(op):
    reg = build_registry(modules=[("eager", reference)], include_entry_points=False, env={})
    for rk in reg.for_op(op):
        if rk.spec.supports_compile:
            why = check_compiles(reg, op, rk.spec.variant, rk.spec.name)
            if {"any", "cpu"} & set(rk.spec.hardware.device_types) or torch.cuda.is_available():
                assert why is None, why
            else:  # flex_attention: CUDA only (FlexAttention has no backward on the CPU)
                assert why.startswith("cannot run here"), why


def _with_triton_like_norm():
    """The reference plus a priority-30 rms_norm kernel that says it compiles (as veomni-triton's)."""
    mod = types.ModuleType("compile_pref_specs")

    @hookimpl
    def rms_norm():
        return [KernelSpec(name="fastnorm", op="rms_norm", variant="standard", supports_compile=True, priority=30,
                           factory="veomni_ops.kernels.rms_norm:rms_norm_standard",
                           hardware=veomni_ops.HardwareRequirement(("cuda", "cpu")))]

    mod.rms_norm = rms_norm
    return build_registry(modules=[("eager", reference), ("pref", mod)], include_entry_points=False, env={})


def test_compile_mode_auto_takes_the_measured_choice_on_cuda_only():
    reg = _with_triton_like_norm()
    needs = {"rms_norm": ["standard"], "cross_entropy": [("fused_linear", "logits")]}
    plan = veomni_ops.resolve({}, "cuda:9.0", needs=needs, registry=reg, compile=True, load=False)
    norm, ce = plan.get("rms_norm", "standard"), plan.get("cross_entropy", "logits")
    assert norm.kernel == "eager" and "compile mode" in norm.reason and "compile-ablation" in norm.reason
    assert ce is not None and ce.kernel == "eager" and plan.get("cross_entropy", "fused_linear") is None
    # Not compile mode, or not a measured device: the priority order.
    assert veomni_ops.resolve({}, "cuda:9.0", needs=needs, registry=reg, load=False).get(
        "rms_norm", "standard").kernel == "fastnorm"
    assert veomni_ops.resolve({}, "cpu", needs=needs, registry=reg, compile=True).get(
        "rms_norm", "standard").kernel == "fastnorm"
    # A named kernel is never replaced.
    named = veomni_ops.resolve({"rms_norm_implementation": "fastnorm"}, "cuda:9.0", needs=needs, registry=reg,
                               compile=True, load=False)
    assert named.get("rms_norm", "standard").kernel == "fastnorm"


def test_compile_mode_cross_entropy_prefers_the_measured_fused_kernel_then_the_logits_loss():
    """The cross-entropy preferences are ordered: veomni-triton's fused linear loss where it is
    registered and usable, else the compiled logits loss (the test above, without it)."""
    mod = types.ModuleType("flce_pref_specs")

    @hookimpl
    def cross_entropy():
        return [KernelSpec(name="triton", op="cross_entropy", variant="fused_linear", supports_compile=True,
                           priority=30, factory="veomni_ops.kernels.cross_entropy:chunked_fused_linear_cross_entropy_sum",
                           hardware=veomni_ops.HardwareRequirement(("cuda",), min_capability=(8, 0)))]

    mod.cross_entropy = cross_entropy
    reg = build_registry(modules=[("eager", reference), ("flce", mod)], include_entry_points=False, env={})
    needs = {"cross_entropy": [("fused_linear", "logits")]}
    plan = veomni_ops.resolve({}, "cuda:9.0", needs=needs, registry=reg, compile=True, load=False)
    ce = plan.get("cross_entropy", "fused_linear")
    assert ce is not None and ce.kernel == "triton" and plan.get("cross_entropy", "logits") is None
    assert "compile mode" in ce.reason and "h100-2026-11-25-flce" in ce.reason
    # Without the fused kernel (here: below its capability range) the next preference applies, the
    # compiled logits loss -- on the capability it was measured on.
    reg_ref = build_registry(modules=[("eager", reference)], include_entry_points=False, env={})
    logits = veomni_ops.resolve({}, "cuda:9.0", needs=needs, registry=reg_ref, compile=True, load=False)
    assert logits.get("cross_entropy", "logits").kernel == "eager"
    assert "compile-ablation" in logits.get("cross_entropy", "logits").reason
    # On sm 7.0 nothing was measured: the priority order, and the plan says why.
    old = veomni_ops.resolve({}, "cuda:7.0", needs=needs, registry=reg, compile=True, load=False)
    entry = old.get("cross_entropy", "fused_linear") or old.get("cross_entropy", "logits")
    assert "by measurement" not in entry.reason
    assert "compile-mode measurements of cross_entropy (sm 9.0 only) do not apply on sm 7.0" in entry.reason


@pytest.mark.parametrize("device", ["cuda:8.0", "cuda:8.9", "cuda:10.0", "cuda:12.0", "cuda"])
def test_compile_preferences_apply_on_the_measured_capability_only(device):
    """Every compile-mode preference was measured on an H100 (sm 9.0): on another capability, or
    an unknown one, compile-mode auto keeps the priority order and says so; on sm 9.0 it takes
    the measured choice and says where it was measured."""
    reg = _with_triton_like_norm()
    needs = {"rms_norm": ["standard"]}
    here = veomni_ops.resolve({}, "cuda:9.0", needs=needs, registry=reg, compile=True, load=False)
    norm = here.get("rms_norm", "standard")
    assert norm.kernel == "eager" and "by measurement on sm 9.0 (applied there only)" in norm.reason
    other = veomni_ops.resolve({}, device, needs=needs, registry=reg, compile=True, load=False)
    norm = other.get("rms_norm", "standard")
    assert norm.kernel == "fastnorm" and norm.reason.startswith("auto: highest priority usable here")
    cap = device.partition(":")[2]
    assert f"measurements of rms_norm (sm 9.0 only) do not apply on {'sm ' + cap if cap else 'an unknown capability'}" \
        in norm.reason
    # not compile mode: no word about compile measurements
    assert "compile-mode" not in veomni_ops.resolve({}, device, needs=needs, registry=reg, load=False).get(
        "rms_norm", "standard").reason


def test_compile_mode_says_when_the_measured_choice_fails_to_load():
    """Compile-mode auto passes over a measured-best kernel whose factory fails to import, and
    the plan's reason says so (it used to be skipped without a word)."""
    mod = types.ModuleType("flce_broken_specs")

    @hookimpl
    def cross_entropy():
        return [KernelSpec(name="triton", op="cross_entropy", variant="fused_linear", supports_compile=True,
                           priority=30, factory="vo_no_such_module_for_this_test:fn",
                           hardware=veomni_ops.HardwareRequirement(("cuda",), min_capability=(8, 0)))]

    mod.cross_entropy = cross_entropy
    reg = build_registry(modules=[("eager", reference), ("flce", mod)], include_entry_points=False, env={})
    needs = {"cross_entropy": [("fused_linear", "logits")]}
    plan = veomni_ops.resolve({}, "cuda:9.0", needs=needs, registry=reg, compile=True, load=True)
    assert plan.get("cross_entropy", "fused_linear") is None
    ce = plan.get("cross_entropy", "logits")
    assert ce is not None and ce.kernel == "eager"
    assert "passed over the measured compile-mode choice triton (its kernel failed to import (ModuleNotFoundError" \
        in ce.reason, ce.reason
