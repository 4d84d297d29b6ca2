import logging

import pytest
from conftest import make_plugin
from veomni_ops import DuplicateKernelError, KernelSpec, PluginLoadError, build_registry, hookimpl
from veomni_ops.registry import Provenance, Registry


def sw(name, **kw):
    return KernelSpec(name=name, op="swiglu", variant="standard", factory="math:sqrt", **kw)


def test_one_bad_plugin_does_not_stop_others():
    good = make_plugin("good", swiglu=[sw("good")])
    raising = make_plugin("raising")
    raising.swiglu = hookimpl(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    raising.swiglu.__name__ = "swiglu"
    misspelt = make_plugin("misspelt")
    def swiglo():
        return []
    misspelt.swiglo = hookimpl(swiglo)
    reg = build_registry([("raising", raising), ("misspelt", misspelt), ("good", good)], include_entry_points=False, env={})
    assert [k.spec.name for k in reg] == ["good"]
    status = {p.provenance.entry_point: (p.status, p.reason) for p in reg.plugins}
    assert status["good"][0] == "loaded"
    assert status["raising"] == ("failed", "RuntimeError: boom")
    assert status["misspelt"][0] == "failed" and "unknown hook 'swiglo'" in status["misspelt"][1]
    assert "the hooks a backend may implement are: rms_norm" in status["misspelt"][1]


def test_plugin_returning_wrong_type_is_a_failure():
    p = make_plugin("p", swiglu=[{"name": "x"}])
    reg = build_registry([("p", p)], include_entry_points=False, env={})
    assert reg.failures[0].phase == "validate"
    assert "expected veomni_ops.KernelSpec" in reg.failures[0].message


def test_wrong_op_from_hook_is_a_failure():
    p = make_plugin("p", rms_norm=[sw("x")])
    reg = build_registry([("p", p)], include_entry_points=False, env={})
    assert "hook rms_norm() returned a spec for op 'swiglu'" in reg.failures[0].message


def test_duplicate_names_both_distributions():
    # Two distributions, one name: both load, the name is contested (test_names_and_versions.py).
    a = make_plugin("a", swiglu=[sw("Same")])
    b = make_plugin("b", swiglu=[sw("same")])
    reg = build_registry([("a", a), ("b", b)], include_entry_points=False, env={})
    assert reg.failures == []
    assert [k.provenance.distribution for k in reg] == ["a", "b"]
    assert "kernel name 'same' for swiglu is registered by 2 distributions: a local (entry point 'a') and " \
           "b local (entry point 'b')" in reg.contest_message("swiglu", "same")


def test_duplicate_within_registry_is_atomic():
    reg = Registry()
    prov = Provenance("d", "1", "d")
    reg.add_all([sw("x")], prov)
    # The same distribution again (another entry point): a qualified name cannot tell them apart.
    with pytest.raises(DuplicateKernelError, match="registered twice by one distribution"):
        reg.add_all([sw("y"), sw("x")], Provenance("d", "1", "e"))
    assert [k.spec.name for k in reg] == ["x"]  # y was not half-added


def test_allow_deny_strict_trace(caplog):
    a = make_plugin("alpha", swiglu=[sw("alpha")])
    b = make_plugin("beta", swiglu=[sw("beta")])
    mods = [("alpha", a), ("beta", b)]
    reg = build_registry(mods, include_entry_points=False, env={"VEOMNI_OPS_PLUGINS": "beta"})
    assert [k.spec.name for k in reg] == ["beta"]
    assert {p.provenance.entry_point: p.reason for p in reg.plugins}["alpha"] == "not in VEOMNI_OPS_PLUGINS='beta'"
    assert len(build_registry(mods, include_entry_points=False, env={"VEOMNI_OPS_PLUGINS": ""})) == 0
    reg = build_registry(mods, include_entry_points=False, env={"VEOMNI_OPS_DISABLE": "alpha"})
    assert [k.spec.name for k in reg] == ["beta"]
    broken = make_plugin("broken")
    broken.swiglu = hookimpl(lambda: 1 / 0)
    broken.swiglu.__name__ = "swiglu"
    with pytest.raises(PluginLoadError, match="VEOMNI_OPS_STRICT=1 makes every plugin load failure fatal"):
        build_registry([("broken", broken)], include_entry_points=False, env={"VEOMNI_OPS_STRICT": "1"})
    with caplog.at_level(logging.INFO, logger="veomni_ops"):
        build_registry(mods, include_entry_points=False, env={"VEOMNI_OPS_TRACE": "1"})
    assert "call alpha.swiglu()" in caplog.text
