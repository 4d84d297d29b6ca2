"""What the conformance kit does not cover: discovery, resolution by name, input errors, compile."""

import subprocess
import sys

import pytest
import torch
from veomni_ops import OpsConfig, discover, resolve


def test_discovered_through_the_entry_point():
    reg = discover()
    rk = reg.get("swiglu", "standard", "template")
    assert rk is not None, f"not discovered; plugins: {[p.to_dict() for p in reg.plugins]}"
    assert rk.provenance.distribution == "veomni-backend-template"
    assert rk.provenance.entry_point == "template"


def test_resolved_by_name_from_a_config():
    plan = resolve(OpsConfig.from_dict({"model": {"ops_implementation": {"swiglu_mlp_implementation": "template"}}}),
                   "cpu", needs={"swiglu": ["standard"]})
    e = plan.get("swiglu", "standard")
    assert (e.kernel, e.distribution, e.reason) == ("template", "veomni-backend-template", "requested by name")
    from veomni_backend_template.kernels.swiglu import silu_mul

    assert plan.kernel("swiglu", "standard") is silu_mul


def test_installed_it_does_not_take_auto():
    """At priority 0 (the core's eager's), installing this backend changes no one's `auto`: on a
    tie the core's kernel wins, and the plan says whom it passed over. At the old 5, an installed
    copy took `auto` wherever nothing above 5 was usable (on a CPU: swiglu, in every model)."""
    plan = resolve(OpsConfig(), "cpu", needs={"swiglu": ["standard"]})
    e = plan.get("swiglu", "standard")
    assert e.distribution != "veomni-backend-template", e
    if "(priority 0)" in e.reason:  # nothing above 0 usable here (with the core alone: its eager)
        assert "tie at priority 0 with template@veomni-backend-template" in e.reason, e.reason


def test_declares_the_plugin_api_range_it_was_built_for():
    import veomni_backend_template.specs as specs
    from veomni_ops import PLUGIN_API_VERSION
    from veomni_ops.hookspecs import api_range_problem

    assert specs.VEOMNI_OPS_PLUGIN_API == ">=1.0,<2"
    assert api_range_problem(specs.VEOMNI_OPS_PLUGIN_API, PLUGIN_API_VERSION) is None
    rec = [p for p in discover().plugins if p.provenance.entry_point == "template"]
    assert rec and rec[0].status == "loaded" and rec[0].warnings == (), rec


def test_spec_module_is_light():
    code = "import sys, veomni_backend_template.specs; assert 'torch' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bad_inputs_say_what_to_do():
    from veomni_backend_template.kernels.swiglu import silu_mul

    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match=r"gate \(2, 4\) and up \(2, 5\) must have the same shape"):
        silu_mul(x, torch.randn(2, 5))
    with pytest.raises(TypeError, match=r"swiglu \(template\): inputs have different dtypes \(gate torch.float32, up torch.bfloat16\)"):
        silu_mul(x, x.bfloat16())
    with pytest.raises(TypeError, match="has dtype torch.int64"):
        silu_mul(x.long(), x.long())


def test_gradcheck_float64():
    from veomni_backend_template.kernels.swiglu import silu_mul

    g = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    u = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(silu_mul, (g, u))


def test_traces_under_compile_fullgraph():
    from veomni_backend_template.kernels.swiglu import silu_mul

    fn = torch.compile(silu_mul, fullgraph=True, backend="aot_eager")
    g = torch.randn(4, 8, requires_grad=True)
    u = torch.randn(4, 8, requires_grad=True)
    out = fn(g, u)
    out.sum().backward()
    torch.testing.assert_close(out, torch.nn.functional.silu(g) * u)
