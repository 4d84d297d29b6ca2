"""Registration and metadata of the quack backend: what it declares, that declaring imports no
Quack/CUTLASS, and how resolution gates it by device, requirements and import failures."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import veomni_ops
import veomni_ops.backends.reference
import veomni_quack.specs as specs
from _helpers import EXPECTED, all_specs
from conftest import STANDINS
from packaging.requirements import Requirement
from packaging.version import Version
from veomni_ops import KernelSpec, OpsConfig, build_registry, resolve
from veomni_ops.resolve import ResolutionError
from veomni_ops.testing.backend_tests import signature

PLUGIN_ROOT = Path(__file__).resolve().parents[1]

P = inspect.Parameter.POSITIONAL_OR_KEYWORD
K = inspect.Parameter.KEYWORD_ONLY
# The parameter lists of the op contracts (core/src/veomni_ops/hookspecs.py).
CONTRACT_SIGNATURES = {
    ("rms_norm", "standard"): [("hidden_states", P, None), ("weight", P, None), ("eps", P, None)],
    ("rms_norm", "offset"): [("hidden_states", P, None), ("weight", P, None), ("eps", P, None)],
    ("cross_entropy", "logits"): [("logits", P, None), ("labels", P, None), ("ignore_index", K, -100)],
    ("cross_entropy", "fused_linear"): [
        ("hidden", P, None), ("weight", P, None), ("labels", P, None), ("bias", K, None), ("ignore_index", K, -100),
    ],
    ("moe_experts", "standard"): [
        ("hidden_states", P, None), ("top_k_index", P, None), ("top_k_weights", P, None), ("gate_up_proj", P, None),
        ("down_proj", P, None),
    ],
}
NEEDS = {"rms_norm": ["standard", "offset"], "cross_entropy": ["logits", "fused_linear"], "moe_experts": ["standard"]}


def quack_registry():
    return build_registry(modules=[("eager", veomni_ops.backends.reference), ("quack", specs)],
                          include_entry_points=False, env={})


def test_registers_exactly_the_expected_kernels():
    reg = quack_registry()
    assert not reg.failures, [f.describe() for f in reg.failures]
    assert {(s.op, s.variant): s.factory for s in all_specs()} == EXPECTED
    # No elementwise SwiGLU, no contract-shaped RoPE, nothing for the rest.
    for op in ("swiglu", "rotary", "load_balancing_loss", "attention"):
        assert not hasattr(specs, op)
    registered = {(k.spec.op, k.spec.variant) for k in reg if k.spec.name == "quack"}
    assert registered == set(EXPECTED)


@pytest.mark.parametrize("spec", all_specs(), ids=lambda s: f"{s.op}-{s.variant}")
def test_spec_metadata(spec: KernelSpec):
    assert spec.name == "quack" and spec.priority == 25
    assert spec.hardware.device_types == ("cuda",)
    assert spec.hardware.min_capability == (9, 0) and spec.hardware.max_capability is None
    assert spec.install_hint == 'pip install "veomni-ops[quack]"'
    assert spec.supports_backward is True and spec.supports_compile is (spec.op == "moe_experts")
    assert {d for d, _ in spec.tolerances} == set(spec.dtypes)
    if spec.variant == "fused_linear":
        assert spec.dtypes == ("bfloat16", "float16")
        assert "NOT YET RUN" in spec.description
    elif spec.op == "moe_experts":
        assert spec.dtypes == ("bfloat16", "float16")
        assert spec.parallel == ("ep",)
    else:
        assert spec.dtypes == ("float32", "bfloat16", "float16")
    for d in spec.dtypes:
        t = spec.tolerance(d)
        assert 0 < t.atol < 0.1 and 0 < t.rtol < 0.1


@pytest.mark.parametrize("spec", all_specs(), ids=lambda s: f"{s.op}-{s.variant}")
def test_requirements_pin_what_has_been_run(spec: KernelSpec):
    reqs = {Requirement(r).name: Requirement(r).specifier for r in spec.requires}
    assert set(reqs) == {"quack-kernels", "nvidia-cutlass-dsl"}
    assert reqs["quack-kernels"].contains("0.6.5") and not reqs["quack-kernels"].contains("0.6.4")
    assert not reqs["quack-kernels"].contains("0.7.0")
    assert reqs["nvidia-cutlass-dsl"].contains("4.8.1") and not reqs["nvidia-cutlass-dsl"].contains("4.8.0")


def test_pyproject():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((PLUGIN_ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "veomni-quack" and project["version"] == "0.1.0"
    deps = {Requirement(d).name: Requirement(d) for d in project["dependencies"]}
    assert set(deps) == {"veomni-ops", "quack-kernels", "nvidia-cutlass-dsl"}
    assert str(deps["quack-kernels"].specifier) == str(Requirement(all_specs()[0].requires[0]).specifier)
    assert project["entry-points"]["veomni_ops.backends"] == {"quack": "veomni_quack.specs"}
    assert Version(project["version"])


@pytest.mark.parametrize("key", sorted(EXPECTED), ids=lambda k: "-".join(k))
def test_factories_import_and_match_the_op_contract(key):
    mod, _, attr = EXPECTED[key].partition(":")
    fn = getattr(importlib.import_module(mod), attr)
    assert callable(fn)
    assert signature(fn) == CONTRACT_SIGNATURES[key]


def test_discovery_imports_no_quack_or_cutlass():
    # Fresh interpreter with the stand-in importable: if declaring (or building a registry)
    # imported quack, it would succeed and show in sys.modules.
    code = (
        "import json, sys, importlib.util\n"
        "import veomni_quack.specs as s\n"
        "from veomni_ops import OPS, build_registry\n"
        "n = sum(len(list(getattr(s, op)())) for op in OPS if hasattr(s, op))\n"
        "reg = build_registry([('veomni-quack', s)], include_entry_points=False, env={})\n"
        "bad = [m for m in ('quack', 'cutlass', 'torch', 'triton', 'veomni_quack.kernels') if m in sys.modules]\n"
        "origin = importlib.util.find_spec('quack').origin\n"
        "print(json.dumps({'n': n, 'failures': len(reg.failures), 'bad': bad, 'origin': origin}))\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(STANDINS), *[p for p in sys.path if p]])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"n": len(EXPECTED), "failures": 0, "bad": [],
                      "origin": str(STANDINS / "quack" / "__init__.py")}, out.stderr


# --------------------------------------------------------------------------- resolution
def test_sm80_is_refused_with_the_capability():
    with pytest.raises(ResolutionError) as ei:
        resolve(OpsConfig(rms_norm_implementation="quack"), device="cuda:8.0", registry=quack_registry(),
                needs={"rms_norm": ["standard"]}, load=False)
    msg = str(ei.value)
    assert "needs compute capability >= 9.0, this device has 8.0" in msg
    assert "rms_norm_implementation='quack'" in msg


@pytest.mark.parametrize("device", ["cuda:9.0", "cuda:10.0"])
def test_hopper_and_blackwell_accept_without_loading(device):
    plan = resolve(OpsConfig(rms_norm_implementation="quack", cross_entropy_loss_implementation="quack", moe_implementation="quack"),
                   device=device, registry=quack_registry(), needs=NEEDS, load=False)
    got = {(e.op, e.variant): e.kernel for e in plan.entries}
    assert got == {key: "quack" for key in EXPECTED}
    assert all(e.fn is None for e in plan.entries)


def test_auto_prefers_quack_on_hopper_and_keeps_eager_on_ampere():
    reg = quack_registry()
    plan = resolve(OpsConfig(), device="cuda:9.0", registry=reg, needs=NEEDS, dtype="bfloat16", load=False)
    assert all(e.kernel == "quack" and "priority 25" in e.reason for e in plan.entries)
    plan = resolve(OpsConfig(), device="cuda:8.0", registry=reg, needs={"rms_norm": ["standard"]}, load=False)
    assert plan.entries[0].kernel != "quack"


def test_fused_linear_in_float32_is_not_offered():
    with pytest.raises(ResolutionError, match="does not support dtype float32"):
        resolve(OpsConfig(cross_entropy_loss_implementation="quack"), device="cuda:9.0", registry=quack_registry(),
                needs={"cross_entropy": ["fused_linear"]}, dtype="float32", load=False)


def test_loading_on_hopper_imports_the_adapters():
    plan = resolve(OpsConfig(rms_norm_implementation="quack", cross_entropy_loss_implementation="quack", moe_implementation="quack"),
                   device="cuda:9.0", registry=quack_registry(), needs=NEEDS, load=True)
    for e in plan.entries:
        assert callable(e.fn) and e.fn.__module__.startswith("veomni_quack.kernels.")


def test_missing_quack_distribution_is_refused_with_the_install_hint(monkeypatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != STANDINS])
    # Absent whether or not the real quack-kernels is installed in this environment (the
    # plugin's own nox session installs it as a dependency).
    import importlib.metadata as md

    real_version = md.version

    def version(name):
        if name.lower().replace("_", "-") == "quack-kernels":
            raise md.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(md, "version", version)  # what the core's requirement check reads
    with pytest.raises(ResolutionError) as ei:
        # check_requires=True: as on an H100 (planned from this machine, requirements are not checked)
        resolve(OpsConfig(rms_norm_implementation="quack"), device="cuda:9.0", registry=quack_registry(),
                needs={"rms_norm": ["standard"]}, load=False, check_requires=True)
    msg = str(ei.value)
    assert "requires quack-kernels>=0.6.5,<0.7, which is not installed" in msg
    assert 'pip install "veomni-ops[quack]"' in msg


def _forget_adapters(monkeypatch):
    import veomni_quack

    # The kernel cache of the core's resolver (veomni_ops.resolve is the function; the cache is in its load module).
    monkeypatch.setattr(sys.modules["veomni_ops.resolve.load"], "_loaded", {})
    if hasattr(veomni_quack, "kernels"):
        monkeypatch.setattr(veomni_quack, "kernels", veomni_quack.kernels)
    for name in [m for m in sys.modules if m.startswith("veomni_quack.kernels.")]:
        monkeypatch.delitem(sys.modules, name)


def test_quack_module_missing_at_import_names_the_install_command(monkeypatch):
    _forget_adapters(monkeypatch)
    monkeypatch.setitem(sys.modules, "quack.rmsnorm", None)  # import -> ModuleNotFoundError
    with pytest.raises(ImportError, match=r'pip install "veomni-ops\[quack\]"'):
        importlib.import_module("veomni_quack.kernels.rms_norm")


def test_broken_linear_cross_entropy_import_is_refused_with_the_error_chained(monkeypatch, tmp_path):
    # As measured with nvidia-cutlass-dsl 4.8.1: the module raises while being imported.
    _forget_adapters(monkeypatch)
    import quack

    (tmp_path / "linear_cross_entropy.py").write_text(
        "raise RuntimeError('epilogue fn depends on <ContextVar> which has no fail-closed semantic key')\n"
    )
    monkeypatch.setattr(quack, "__path__", [str(tmp_path), *quack.__path__])
    monkeypatch.delitem(sys.modules, "quack.linear_cross_entropy", raising=False)
    reg = quack_registry()
    with pytest.raises(ResolutionError) as ei:
        resolve(OpsConfig(cross_entropy_loss_implementation="quack"), device="cuda:9.0", registry=reg,
                needs={"cross_entropy": ["fused_linear"]}, load=True)
    msg = str(ei.value)
    assert "failed to import" in msg and "fail-closed semantic key" in msg
    cause = ei.value.__cause__
    assert isinstance(cause, ImportError) and isinstance(cause.__cause__, RuntimeError)
    # The logits variant of the same backend is unaffected (it never imports that module).
    plan = resolve(OpsConfig(cross_entropy_loss_implementation="quack"), device="cuda:9.0", registry=reg,
                   needs={"cross_entropy": ["logits"]}, load=True)
    assert plan.entries[0].fn.__module__ == "veomni_quack.kernels.cross_entropy"
