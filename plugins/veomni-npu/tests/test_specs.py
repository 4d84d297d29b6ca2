"""Registration and metadata of the npu backend: what it declares, that declaring is cheap,
and how resolution gates it by device and by the torch-npu requirement."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import veomni_npu.specs as specs
import veomni_ops
import veomni_ops.backends.reference
from _helpers import EXPECTED, STANDINS, all_specs
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from veomni_ops import KernelSpec, OpsConfig, build_registry, resolve
from veomni_ops.resolve import ResolutionError
from veomni_ops.testing.backend_tests import signature

PLUGIN_ROOT = Path(__file__).resolve().parents[1]

# The parameter lists of the op contracts (core/src/veomni_ops/hookspecs.py): name, kind, default.
P = inspect.Parameter.POSITIONAL_OR_KEYWORD
KW = inspect.Parameter.KEYWORD_ONLY
CONTRACT_SIGNATURES = {
    "rms_norm": [("hidden_states", P, None), ("weight", P, None), ("eps", P, None)],
    "rotary": [("q", P, None), ("k", P, None), ("cos", P, None), ("sin", P, None)],
    "swiglu": [("gate", P, None), ("up", P, None)],
    "moe_experts": [
        ("hidden_states", P, None), ("top_k_index", P, None), ("top_k_weights", P, None),
        ("gate_up_proj", P, None), ("down_proj", P, None),
    ],
    "attention": [
        ("module", P, None), ("query", P, None), ("key", P, None), ("value", P, None), ("attention_mask", P, None),
        ("dropout", KW, 0.0), ("scaling", KW, None), ("sliding_window", KW, None), ("softcap", KW, None),
        ("kwargs", inspect.Parameter.VAR_KEYWORD, None),
    ],
}
NEEDS = {"rms_norm": ["standard", "offset"], "rotary": ["full", "partial"], "swiglu": ["standard"],
         "moe_experts": ["standard"], "attention": ["standard"]}


def npu_registry(name: str = "npu"):
    return build_registry(modules=[("eager", veomni_ops.backends.reference), (name, specs)],
                          include_entry_points=False, env={})


def test_registers_exactly_the_expected_kernels():
    reg = npu_registry()
    assert not reg.failures, [f.describe() for f in reg.failures]
    got = {(s.op, s.variant): s.factory for s in all_specs()}
    assert got == EXPECTED
    assert all(s.name == "npu" for s in all_specs())
    # VeOmni's NPU cross-entropy is plain-PyTorch chunking (the core's 'chunked'); no torch_npu
    # kernel with the load-balancing contract is adapted.
    for op in ("cross_entropy", "load_balancing_loss"):
        assert not hasattr(specs, op)
    registered = {(k.spec.op, k.spec.variant, k.spec.name) for k in reg if k.provenance.distribution == "npu"}
    assert registered == {(op, v, "npu") for op, v in EXPECTED}


@pytest.mark.parametrize("spec", all_specs(), ids=lambda s: f"{s.op}-{s.variant}")
def test_spec_metadata(spec: KernelSpec):
    assert spec.priority == 20
    assert spec.hardware.device_types == ("npu",)
    assert spec.hardware.min_capability is None and spec.hardware.max_capability is None
    # The plugin, and what really provides the kernels: torch-npu on the Ascend CANN toolkit.
    assert spec.install_hint.startswith('pip install "veomni-ops[npu]"')
    assert "torch-npu" in spec.install_hint and "CANN" in spec.install_hint
    # torch_npu registers autograd for every op used (op-plugin derivatives.yaml); the grouped
    # matmul's backward is the adapter's own.
    assert spec.supports_backward is True
    assert spec.supports_compile is False  # never traced on an NPU
    # npu_fusion_attention: float16/bfloat16 in every torch_npu release's docs (float32 only in newer ones)
    assert spec.dtypes == (("bfloat16", "float16") if spec.op == "attention" else ("float32", "bfloat16", "float16"))
    assert "not run on an NPU" in spec.description
    assert {d for d, _ in spec.tolerances} == set(spec.dtypes)
    for d in spec.dtypes:
        t = spec.tolerance(d)
        assert 0 < t.atol < 0.1 and 0 < t.rtol < 0.1
    rtols = [spec.tolerance(d).rtol for d in ("bfloat16", "float16", "float32") if d in spec.dtypes]
    assert rtols == sorted(rtols, reverse=True)


@pytest.mark.parametrize("spec", all_specs(), ids=lambda s: f"{s.op}-{s.variant}")
def test_requirement_is_the_pypi_distribution_torch_npu(spec: KernelSpec):
    (text,) = spec.requires
    req = Requirement(text)
    # PyPI's name is "torch-npu" (import name torch_npu); both spellings normalise to it.
    assert canonicalize_name(req.name) == "torch-npu"
    (clause,) = req.specifier
    assert clause.operator == ">="
    floor = Version("2.7.1") if spec.op == "moe_experts" else Version("2.1")
    assert Version(clause.version) == floor


def test_pyproject_has_only_the_core_as_dependency_and_torch_npu_as_extra():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((PLUGIN_ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "veomni-npu" and project["version"] == "0.1.0"
    assert project["dependencies"] == ["veomni-ops>=0.1.0"]
    (extra,) = project["optional-dependencies"]["torch-npu"]
    assert canonicalize_name(Requirement(extra).name) == "torch-npu"
    assert project["entry-points"]["veomni_ops.backends"] == {"npu": "veomni_npu.specs"}


@pytest.mark.parametrize("key", sorted(EXPECTED), ids=lambda k: "-".join(k))
def test_factories_import_and_match_the_op_contract(key):
    op, variant = key
    mod, _, attr = EXPECTED[key].partition(":")
    fn = getattr(importlib.import_module(mod), attr)
    assert callable(fn)
    assert signature(fn) == CONTRACT_SIGNATURES[op]


def test_discovery_imports_no_torch_npu():
    # A fresh interpreter with the stand-in importable: if the spec module (or building a
    # registry from it) imported torch_npu, it would succeed and show in sys.modules.
    code = (
        "import json, sys\n"
        "import veomni_npu.specs as s\n"
        "from veomni_ops import OPS, build_registry\n"
        "n = sum(len(list(getattr(s, op)())) for op in OPS if hasattr(s, op))\n"
        "reg = build_registry([('veomni-npu', s)], include_entry_points=False, env={})\n"
        "bad = [m for m in ('torch_npu', 'torch', 'veomni_npu.kernels') if m in sys.modules]\n"
        # The stand-in was importable all along (found, not imported: importing it imports torch).
        "import importlib.util\n"
        "origin = importlib.util.find_spec('torch_npu').origin\n"
        "print(json.dumps({'n': n, 'failures': len(reg.failures), 'bad': bad, 'origin': origin}))\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(STANDINS), *[p for p in sys.path if p]])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"n": len(EXPECTED), "failures": 0, "bad": [],
                      "origin": str(STANDINS / "torch_npu" / "__init__.py")}, out.stderr


# --------------------------------------------------------------------------- resolution
def test_auto_on_an_npu_device_picks_the_npu_kernels():
    reg = npu_registry()
    plan = resolve(OpsConfig(), device="npu", registry=reg, needs=NEEDS, load=False)
    got = {(e.op, e.variant): e.kernel for e in plan.entries}
    assert got == {key: "npu" for key in EXPECTED}
    for e in plan.entries:
        assert "priority 20" in e.reason


def test_auto_on_cpu_keeps_the_reference_kernels():
    reg = npu_registry()
    plan = resolve(OpsConfig(), device="cpu", registry=reg, needs=NEEDS, load=False)
    assert all(e.kernel != "npu" for e in plan.entries)


def test_auto_on_npu_loads_the_adapters_through_torch_npu():
    # load=True imports every factory (here against the stand-in torch_npu).
    reg = npu_registry()
    plan = resolve(OpsConfig(), device="npu", registry=reg, needs=NEEDS, load=True)
    for e in plan.entries:
        assert callable(e.fn) and e.fn.__module__.startswith("veomni_npu.kernels.")


def test_veomni_config_values_select_npu_by_name():
    reg = npu_registry()
    with pytest.warns(Warning):  # fused_npu is VeOmni's legacy value for moe_implementation
        cfg = OpsConfig(rms_norm_implementation="npu", rotary_pos_emb_implementation="npu",
                        moe_implementation="fused_npu")
    plan = resolve(cfg, device="npu", registry=reg,
                   needs={"rms_norm": ["offset"], "rotary": ["partial"], "moe_experts": ["standard"]}, load=False)
    assert {(e.op, e.variant, e.kernel) for e in plan.entries} == {
        ("rms_norm", "offset", "npu"), ("rotary", "partial", "npu"), ("moe_experts", "standard", "npu"),
    }


def test_explicit_npu_on_cpu_is_refused():
    reg = npu_registry()
    with pytest.raises(ResolutionError) as ei:
        resolve(OpsConfig(swiglu_mlp_implementation="npu"), device="cpu", registry=reg,
                needs={"swiglu": ["standard"]}, load=False)
    msg = str(ei.value)
    assert "needs a npu device" in msg and "swiglu_mlp_implementation='npu'" in msg


def test_explicit_npu_without_torch_npu_installed_is_refused_with_the_install_hint(monkeypatch):
    # Hide the stand-in distribution metadata: torch-npu is then not installed.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != STANDINS])
    reg = npu_registry()
    with pytest.raises(ResolutionError) as ei:
        # check_requires=True: as on an NPU machine (planned from this one, requirements are not checked)
        resolve(OpsConfig(rms_norm_implementation="npu"), device="npu", registry=reg,
                needs={"rms_norm": ["standard"]}, load=False, check_requires=True)
    msg = str(ei.value)
    assert "requires torch-npu>=2.1, which is not installed" in msg
    assert 'pip install "veomni-ops[npu]"' in msg


def _hide_torch_npu(monkeypatch):
    """Make ``import torch_npu`` fail as on a machine without it, and forget the adapters."""
    import veomni_npu

    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu -> ModuleNotFoundError
    if hasattr(veomni_npu, "kernels"):  # a re-import rebinds the package attribute: restore it too
        monkeypatch.setattr(veomni_npu, "kernels", veomni_npu.kernels)
    for name in [m for m in sys.modules if m.startswith("veomni_npu.kernels")]:
        monkeypatch.delitem(sys.modules, name)


def test_adapters_without_torch_npu_fail_with_how_to_install(monkeypatch):
    _hide_torch_npu(monkeypatch)
    with pytest.raises(ImportError) as ei:
        importlib.import_module("veomni_npu.kernels.rms_norm")
    msg = str(ei.value)
    assert "pip install torch-npu" in msg and "CANN" in msg
    assert isinstance(ei.value.__cause__, ImportError)


def test_resolution_reports_the_failed_torch_npu_import(monkeypatch):
    _hide_torch_npu(monkeypatch)
    # A distinct plugin name: the core caches loaded kernels per provenance.
    reg = npu_registry("npu-without-torch-npu")
    with pytest.raises(ResolutionError) as ei:
        resolve(OpsConfig(swiglu_mlp_implementation="npu"), device="npu", registry=reg,
                needs={"swiglu": ["standard"]}, load=True)
    msg = str(ei.value)
    assert "failed to import" in msg and "pip install torch-npu" in msg
    assert isinstance(ei.value.__cause__, ImportError)

