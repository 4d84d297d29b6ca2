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


def _exiting_hook(op, exc):
    """A plugin module whose ``op`` hook raises ``exc`` (``SystemExit``: what ``sys.exit`` raises)."""
    mod = make_plugin("exits")

    def hook():
        raise exc
    hook.__name__ = op
    setattr(mod, op, hookimpl(hook))
    return mod


def _dist_with_entry_point(root, dist: str, module: str, source: str) -> None:
    """An installed distribution ``dist`` under ``root`` (a sys.path entry) whose entry point in
    veomni-ops' group is ``module``, a module with ``source``."""
    (root / f"{module}.py").write_text(source)
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[veomni_ops.backends]\n{module} = {module}\n")


def test_a_plugin_that_exits_at_import_is_a_named_load_failure(tmp_path, monkeypatch):
    """sys.exit in a plugin's module (or in a hook) used to end every command with no output: it
    is the plugin's load failure, naming it and the fix, and the others load."""
    _dist_with_entry_point(tmp_path, "vo-exits", "vo_exits", "import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    good = make_plugin("good", swiglu=[sw("good")])
    reg = build_registry([("good", good), ("hook_exits", _exiting_hook("swiglu", SystemExit("bye")))],
                         env={"VEOMNI_OPS_PLUGINS": "vo-exits,good,hook_exits"})
    assert "good" in reg.names("swiglu")
    failed = {f.provenance.distribution: f for f in reg.failures}
    assert set(failed) == {"vo-exits", "hook_exits"}, reg.failures
    assert (failed["vo-exits"].phase, failed["hook_exits"].phase) == ("import", "hook:swiglu")
    assert failed["vo-exits"].message == (
        "PluginExitError: importing it called sys.exit(3), which would end the process; veomni-ops went on without "
        "this plugin. A plugin must raise an exception, not exit: fix or uninstall vo-exits (pip uninstall "
        "vo-exits), or disable it with VEOMNI_OPS_DISABLE=vo_exits")
    assert failed["hook_exits"].message.startswith("PluginExitError: its hook swiglu() called sys.exit('bye')")
    assert isinstance(failed["vo-exits"].error.__cause__, SystemExit)
    with pytest.raises(PluginLoadError, match="importing it called sys.exit\\(3\\)"):
        build_registry(env={"VEOMNI_OPS_PLUGINS": "vo-exits", "VEOMNI_OPS_STRICT": "1"})


def test_ctrl_c_while_a_plugin_loads_still_stops():
    """KeyboardInterrupt is the user's, not the plugin's: it is not turned into a load failure."""
    with pytest.raises(KeyboardInterrupt):
        build_registry([("ctrl_c", _exiting_hook("swiglu", KeyboardInterrupt()))], include_entry_points=False, env={})


@pytest.mark.parametrize("name, op, why", [
    ("auto", "swiglu", "'auto' is what a config writes to let veomni-ops pick a kernel, so no config could name "
                       "this one"),
    ("eager", "swiglu", "'eager' is the core's reference kernel (transformers' own computation), which configs, "
                        "plans and the core's fallbacks name; only veomni-ops registers it"),
    ("chunk_loss", "cross_entropy", "a config's 'chunk_loss' is VeOmni's legacy name for 'chunked' and is read as "
                                    "that, so no config could name this kernel"),
])
def test_a_plugin_registering_a_reserved_name_is_refused_naming_it_and_the_fix(name, op, why):
    from veomni_ops.backends import reference

    variant = "logits" if op == "cross_entropy" else "standard"
    bad = make_plugin("mine", **{op: [KernelSpec(name=name, op=op, variant=variant, factory="math:sqrt"),
                                      KernelSpec(name="fine", op=op, variant=variant, factory="math:sqrt")]})
    reg = build_registry([("veomni-ops", reference), ("mine", bad)], include_entry_points=False, env={})
    (failure,) = reg.failures
    assert failure.phase == "validate" and failure.provenance.distribution == "mine"
    assert failure.message == (
        f"ReservedNameError: kernel name {name!r} ({op}/{variant}) is reserved: {why}. mine local (entry point "
        f"'mine') registers it: its authors must rename the kernel (e.g. 'mine_{name}'); until then uninstall it or "
        "disable it (VEOMNI_OPS_DISABLE=mine)")
    assert "fine" not in reg.names(op)  # nothing of the plugin is registered
    # The core's own kernel keeps its name: no contest, and a config naming it resolves.
    if name == "eager":
        assert not reg.contested() and [k.provenance.distribution for k in reg.for_op(op) if k.spec.name == "eager"] \
            == ["veomni-ops"]
