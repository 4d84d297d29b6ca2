"""Registration and metadata of the liger backend: what it declares, and that declaring is cheap."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
from importlib.metadata import version as dist_version
from pathlib import Path

import pytest
import veomni_liger.specs as specs
from packaging.requirements import Requirement
from packaging.version import Version
from veomni_ops import OPS, KernelSpec, OpsConfig, build_registry, parse_device, resolve
from veomni_ops.resolve import ResolutionError, static_problem

PLUGIN_ROOT = Path(__file__).resolve().parents[1]

EXPECTED = {
    ("rms_norm", "standard"): "veomni_liger.kernels.rms_norm:rms_norm_standard",
    ("rms_norm", "offset"): "veomni_liger.kernels.rms_norm:rms_norm_offset",
    ("rotary", "full"): "veomni_liger.kernels.rotary:apply_rotary_full",
    ("rotary", "partial"): "veomni_liger.kernels.rotary:apply_rotary_partial",
    ("swiglu", "standard"): "veomni_liger.kernels.swiglu:silu_mul",
    ("cross_entropy", "logits"): "veomni_liger.kernels.cross_entropy:cross_entropy_sum",
    ("cross_entropy", "fused_linear"): "veomni_liger.kernels.cross_entropy:fused_linear_cross_entropy_sum",
    ("moe_experts", "standard"): "veomni_liger.kernels.moe:moe_experts",
}

# The parameter lists of the op contracts (core/src/veomni_ops/hookspecs.py): name, kind, default.
P, K = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
CONTRACT_SIGNATURES = {
    "rms_norm": [("hidden_states", P, None), ("weight", P, None), ("eps", P, None)],
    "rotary": [("q", P, None), ("k", P, None), ("cos", P, None), ("sin", P, None)],
    "swiglu": [("gate", P, None), ("up", P, None)],
    "cross_entropy/logits": [("logits", P, None), ("labels", P, None), ("ignore_index", K, -100)],
    "cross_entropy/fused_linear": [
        ("hidden", P, None), ("weight", P, None), ("labels", P, None), ("bias", K, None), ("ignore_index", K, -100),
    ],
    "moe_experts": [
        ("hidden_states", P, None), ("top_k_index", P, None), ("top_k_weights", P, None),
        ("gate_up_proj", P, None), ("down_proj", P, None),
    ],
}


def all_specs() -> list[KernelSpec]:
    return [s for op in OPS if hasattr(specs, op) for s in getattr(specs, op)()]


def liger_registry():
    return build_registry([("veomni-liger", specs)], include_entry_points=False, env={})


def test_registers_exactly_the_expected_kernels():
    reg = liger_registry()
    assert not reg.failures, [f.describe() for f in reg.failures]
    got = {(s.op, s.variant): s.factory for s in all_specs()}
    assert got == EXPECTED
    assert all(s.name == "liger" for s in all_specs())
    # Liger 0.8.5 has no load-balancing-loss or attention kernel with these contracts.
    assert not hasattr(specs, "load_balancing_loss") and not hasattr(specs, "attention")


@pytest.mark.parametrize("spec", all_specs(), ids=lambda s: f"{s.op}-{s.variant}")
def test_spec_metadata(spec: KernelSpec):
    assert spec.priority == 20
    assert spec.install_hint == 'pip install "veomni-ops[liger]"'
    assert spec.supports_backward is True
    # Not claimed before a GPU run shows fullgraph tracing works (see specs module doc).
    assert spec.supports_compile is False
    assert spec.dtypes == ("float32", "bfloat16", "float16")
    assert spec.description
    # A tolerance is declared for every dtype (none falls back to the core defaults).
    assert {d for d, _ in spec.tolerances} == set(spec.dtypes)
    for d in spec.dtypes:
        t = spec.tolerance(d)
        assert 0 < t.atol < 0.1 and 0 < t.rtol < 0.1
    # Lower precision never gets a tighter tolerance than float32.
    assert spec.tolerance("bfloat16").rtol >= spec.tolerance("float16").rtol >= spec.tolerance("float32").rtol


@pytest.mark.parametrize("spec", all_specs(), ids=lambda s: f"{s.op}-{s.variant}")
def test_hardware_is_cuda_only_with_a_capability_floor(spec: KernelSpec):
    assert spec.hardware.device_types == ("cuda",)  # never run on ROCm
    assert spec.hardware.max_capability is None
    expected = (9, 0) if spec.op == "moe_experts" else (8, 0)
    assert spec.hardware.min_capability == expected


@pytest.mark.parametrize("spec", all_specs(), ids=lambda s: f"{s.op}-{s.variant}")
def test_requirements_are_liger_lower_bounds_the_installed_release_meets(spec: KernelSpec):
    (text,) = spec.requires
    req = Requirement(text)
    assert req.name == "liger-kernel"
    (clause,) = req.specifier
    assert clause.operator == ">="
    assert Version(clause.version) <= Version("0.8.5")
    assert req.specifier.contains(dist_version("liger-kernel"))


def test_partial_rotary_needs_the_release_that_added_rotary_dim():
    (text,) = next(s for s in specs.rotary() if s.variant == "partial").requires
    assert text == "liger-kernel>=0.8.5"


def test_pyproject_names_the_entry_point_and_a_floor_above_every_spec():
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((PLUGIN_ROOT / "pyproject.toml").read_text())
    project = data["project"]
    assert project["name"] == "veomni-liger" and project["version"] == "0.1.0"
    assert project["entry-points"]["veomni_ops.backends"] == {"liger": "veomni_liger.specs"}
    deps = {Requirement(d).name: Requirement(d) for d in project["dependencies"]}
    assert str(deps["veomni-ops"].specifier) == ">=0.1.0"
    floor = Version(next(iter(deps["liger-kernel"].specifier)).version)
    for s in all_specs():
        spec_floor = Version(next(iter(Requirement(s.requires[0]).specifier)).version)
        assert spec_floor <= floor, f"{s.op}/{s.variant} needs {spec_floor} but the distribution allows {floor}"


@pytest.mark.parametrize("key", sorted(EXPECTED), ids=lambda k: "-".join(k))
def test_factories_import_and_match_the_op_contract(key):
    op, variant = key
    mod, _, attr = EXPECTED[key].partition(":")
    fn = getattr(importlib.import_module(mod), attr)
    assert callable(fn)
    params = [(p.name, p.kind, None if p.default is inspect.Parameter.empty else p.default)
              for p in inspect.signature(fn).parameters.values()]
    contract = CONTRACT_SIGNATURES.get(f"{op}/{variant}", CONTRACT_SIGNATURES.get(op))
    assert params == contract


def test_discovery_imports_neither_liger_nor_triton():
    # A fresh interpreter: import the spec module, call every hook, build a registry from it.
    code = (
        "import json, sys\n"
        "import veomni_liger.specs as s\n"
        "from veomni_ops import OPS, build_registry\n"
        "n = sum(len(list(getattr(s, op)())) for op in OPS if hasattr(s, op))\n"
        "reg = build_registry([('veomni-liger', s)], include_entry_points=False, env={})\n"
        "bad = [m for m in ('liger_kernel', 'triton') if m in sys.modules]\n"
        "print(json.dumps({'n': n, 'failures': len(reg.failures), 'bad': bad}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"n": len(EXPECTED), "failures": 0, "bad": []}, out.stderr


@pytest.mark.parametrize(
    "device, refused",
    [
        ("cpu", set(EXPECTED)),
        ("rocm:9.4", set(EXPECTED)),
        ("cuda:7.5", set(EXPECTED)),
        ("cuda:8.0", {("moe_experts", "standard")}),
        ("cuda:9.0", set()),
        ("cuda:10.0", set()),
    ],
)
def test_device_gating(device, refused):
    dev = parse_device(device)
    got = {(s.op, s.variant) for s in all_specs() if static_problem(s, dev) is not None}
    assert got == refused


def test_resolves_by_name_and_by_legacy_name_for_a_hopper_gpu():
    reg = liger_registry()
    cfg = OpsConfig(rms_norm_implementation="liger", cross_entropy_loss_implementation="liger")
    plan = resolve(cfg, "cuda:9.0", registry=reg, needs={"rms_norm": ["offset"], "cross_entropy": ["fused_linear"]},
                   load=False)
    assert {(e.op, e.variant, e.kernel) for e in plan.entries} == {
        ("rms_norm", "offset", "liger"), ("cross_entropy", "fused_linear", "liger"),
    }
    with pytest.warns(Warning):
        legacy = OpsConfig(rms_norm_implementation="liger_kernel")
    plan = resolve(legacy, "cuda:9.0", registry=reg, needs={"rms_norm": ["standard"]}, load=False)
    assert [(e.op, e.kernel) for e in plan.entries] == [("rms_norm", "liger")]


def test_refused_on_cpu_with_the_install_hint():
    reg = liger_registry()
    with pytest.raises(ResolutionError) as ei:
        resolve(OpsConfig(swiglu_mlp_implementation="liger"), "cpu", registry=reg, needs={"swiglu": ["standard"]},
                load=False)
    msg = str(ei.value)
    assert "liger" in msg and "cuda" in msg
