"""Kernel names nobody can take silently, the plugin API version, and hints that are true.

1. Two distributions registering one kernel name for an op both load; the bare name is
   refused naming both, ``name@distribution`` selects either, and ``auto`` breaks ties by a
   documented rule (priority, variant, origin: core > first-party > others, name, distribution)
   that the plan entry's reason shows.
2. ``veomni_ops.PLUGIN_API_VERSION``; a backend declares ``VEOMNI_OPS_PLUGIN_API``; outside
   the range it is a load failure (phase ``api``) naming both versions and what to upgrade.
3. Install hints that say what really provides a kernel, switches reported as switches,
   failed kernel imports not offered as usable.

Only the core is needed: plugins are modules built here (``make_plugin``), loaded as if they
were entry points of distributions named as given.
"""

from __future__ import annotations

import importlib
import json
import logging
import types

import pytest
from conftest import make_plugin
from veomni_ops import (
    PLUGIN_API_VERSION,
    ContestedNameError,
    DuplicateKernelError,
    HardwareRequirement,
    KernelSpec,
    OpsConfig,
    PluginLoadError,
    ResolutionError,
    SpecError,
    build_registry,
    resolve,
)
from veomni_ops.backends import reference
from veomni_ops.hookspecs import PLUGIN_API_ATTR, PluginAPIError, api_range_problem
from veomni_ops.registry import Provenance, Registry
from veomni_ops.spec import normalize_name, split_name

resolve_mod = importlib.import_module("veomni_ops.resolve")  # the package's ``resolve`` is the function
explain_mod = importlib.import_module("veomni_ops.resolve.explain")  # where install hints find the checkout

ANY = HardwareRequirement(("any",))
CUDA = HardwareRequirement(("cuda",), min_capability=(8, 0))
STD = {"rms_norm": ["standard"]}


def rms(name, factory="math:sqrt", **kw):
    return KernelSpec(name=name, op="rms_norm", variant="standard", factory=factory, **kw)


def sw(name, factory="math:sqrt", **kw):
    return KernelSpec(name=name, op="swiglu", variant="standard", factory=factory, **kw)


def declared(mod: types.ModuleType, rng: str = ">=1.0,<2") -> types.ModuleType:
    setattr(mod, PLUGIN_API_ATTR, rng)
    return mod


def squatted_registry():
    """veomni-liger (first-party, CUDA kernels) and a stranger that registers rms_norm 'liger'."""
    liger = declared(make_plugin("veomni-liger", rms_norm=[rms("liger", hardware=CUDA, priority=20)],
                                 swiglu=[sw("liger", hardware=CUDA, priority=20)]))
    squat = declared(make_plugin("squat", rms_norm=[rms("liger", factory="math:floor", hardware=ANY),
                                                    rms("squat_norm", hardware=ANY)]))
    return build_registry([("veomni-liger", liger), ("squat", squat)], include_entry_points=False, env={})


# -- 1. names ---------------------------------------------------------------------------------


def test_a_contested_name_keeps_both_plugins_loaded():
    reg = squatted_registry()
    assert reg.failures == []
    status = {p.provenance.distribution: p.status for p in reg.plugins}
    assert status == {"veomni-liger": "loaded", "squat": "loaded"}
    # Every kernel of both registered, the other kernels of each plugin too.
    assert {(k.spec.op, k.spec.name, k.provenance.distribution) for k in reg} == {
        ("rms_norm", "liger", "veomni-liger"), ("swiglu", "liger", "veomni-liger"),
        ("rms_norm", "liger", "squat"), ("rms_norm", "squat_norm", "squat")}
    assert reg.is_contested("rms_norm", "liger") and not reg.is_contested("swiglu", "liger")
    # Recorded, on the registry and on both plugins' records.
    msg = ("kernel name 'liger' for rms_norm is registered by 2 distributions: veomni-liger local (entry point "
           "'veomni-liger') and squat local (entry point 'squat'); the bare name selects neither: write "
           "liger@veomni-liger or liger@squat")
    assert msg in reg.notes
    for p in reg.plugins:
        assert msg in p.warnings and msg in p.reason and p.to_dict()["warnings"] == [msg]


def test_the_bare_contested_name_is_refused_naming_both_and_the_qualified_names():
    reg = squatted_registry()
    with pytest.raises(ResolutionError) as ei:
        resolve(OpsConfig(rms_norm_implementation="liger"), "cpu", registry=reg, needs=STD, load=False)
    msg = str(ei.value)
    assert ("rms_norm_implementation='liger' (op rms_norm, variant standard): kernel name 'liger' is registered for "
            "rms_norm by 2 distributions, veomni-liger local (entry point 'veomni-liger') and squat local (entry "
            "point 'squat'), so the bare name selects neither") in msg, msg
    assert ("Write the name qualified by its distribution: rms_norm_implementation: liger@veomni-liger or "
            "rms_norm_implementation: liger@squat.") in msg, msg
    # The disable hint names the distributions, never the real plugin's entry point alone.
    assert "VEOMNI_OPS_DISABLE=<its distribution> (veomni-liger / squat)" in msg, msg
    # What can be had here is listed as a config would write it.
    assert "Usable here for rms_norm/standard: liger@squat, squat_norm." in msg, msg
    # The same name for an op nobody contests still works bare.
    plan = resolve(OpsConfig(swiglu_mlp_implementation="liger"), "cuda:9.0", registry=reg,
                   needs={"swiglu": ["standard"]}, load=False)
    assert plan.get("swiglu", "standard").distribution == "veomni-liger"


def test_a_qualified_name_selects_exactly_that_distribution():
    reg = squatted_registry()
    cfg = OpsConfig(rms_norm_implementation="Liger@Squat")  # normalised like any value
    assert cfg.rms_norm_implementation == "liger@squat"
    e = resolve(cfg, "cpu", registry=reg, needs=STD).get("rms_norm", "standard")
    assert (e.kernel, e.distribution, e.requested, e.reason) == ("liger", "squat", "liger@squat", "requested by name")
    import math

    assert e.fn is math.floor
    e = resolve({"rms_norm_implementation": "liger@veomni_liger"}, "cuda:9.0", registry=reg, needs=STD,
                load=False).get("rms_norm", "standard")
    assert (e.kernel, e.distribution) == ("liger", "veomni-liger")
    # Refused for what it is, not as "not registered".
    with pytest.raises(ResolutionError, match=r"kernel 'liger@veomni-liger' \(veomni-liger local .*\) needs a cuda "
                                              r"device, this is cpu"):
        resolve({"rms_norm_implementation": "liger@veomni-liger"}, "cpu", registry=reg, needs=STD, load=False)


def test_a_qualified_name_of_another_distribution_says_who_has_it():
    reg = squatted_registry()
    with pytest.raises(ResolutionError) as ei:
        resolve({"swiglu_mlp_implementation": "liger@squat"}, "cuda:9.0", registry=reg,
                needs={"swiglu": ["standard"]}, load=False)
    msg = str(ei.value)
    assert "distribution 'squat' registers no kernel 'liger' for swiglu; veomni-liger local (entry point " \
           "'veomni-liger') registers it" in msg, msg
    assert msg.endswith("Write swiglu_mlp_implementation: liger."), msg


def test_qualified_names_normalise_and_bad_ones_are_refused():
    assert normalize_name("Liger@Veomni_Liger") == "liger@veomni-liger"
    assert split_name("flash-attention-2@VEOMNI.flash") == ("flash_attention_2", "veomni-flash")
    assert split_name("liger") == ("liger", None)
    for bad in ("liger@", "@veomni-liger", "a@b@c"):
        with pytest.raises(SpecError, match="is not valid"):
            normalize_name(bad)
    with pytest.raises(SpecError, match="is not valid"):  # a spec's own name is never qualified
        rms("liger@veomni-liger")


def test_registry_get_never_picks_one_of_a_contested_name():
    reg = squatted_registry()
    with pytest.raises(ContestedNameError, match="write liger@veomni-liger or liger@squat"):
        reg.get("rms_norm", "standard", "liger")
    assert reg.get("rms_norm", "standard", "liger@squat").provenance.distribution == "squat"
    assert reg.name_of(reg.get("rms_norm", "standard", "liger@squat")) == "liger@squat"
    assert reg.name_of(reg.get("rms_norm", "standard", "squat_norm")) == "squat_norm"


def test_one_distribution_registering_a_name_twice_still_fails_atomically():
    reg = Registry()
    reg.add_all([sw("x")], Provenance("d", "1", "ep1"))
    with pytest.raises(DuplicateKernelError, match="registered twice by one distribution"):
        reg.add_all([sw("y"), sw("x")], Provenance("d", "1", "ep2"))
    assert [k.spec.name for k in reg] == ["x"]


def test_auto_prefers_the_core_on_a_tie_and_says_so():
    # A third-party kernel at eager's priority 0, whose name sorts before "eager".
    third = declared(make_plugin("aardvark", swiglu=[sw("aaa", hardware=ANY)]))
    reg = build_registry([("veomni-ops", reference), ("aardvark", third)], include_entry_points=False, env={})
    e = resolve(OpsConfig(), "cpu", registry=reg, needs={"swiglu": ["standard"]}, load=False).get("swiglu", "standard")
    assert (e.kernel, e.distribution) == ("eager", "veomni-ops")
    assert e.reason == ("auto: highest priority usable here (priority 0); tie at priority 0 with aaa@aardvark, "
                        "broken by origin: the core (veomni-ops) before third-party")


def test_auto_prefers_first_party_over_third_party_then_name_then_distribution():
    ours = declared(make_plugin("veomni-triton", swiglu=[sw("zzz", hardware=ANY, priority=30)]))
    theirs = declared(make_plugin("aaa-dist", swiglu=[sw("aaa", hardware=ANY, priority=30),
                                                      sw("bbb", hardware=ANY, priority=7)]))
    more = declared(make_plugin("bbb-dist", swiglu=[sw("bbb", hardware=ANY, priority=7)]))
    reg = build_registry([("aaa-dist", theirs), ("veomni-triton", ours), ("bbb-dist", more)],
                         include_entry_points=False, env={})
    need = {"swiglu": ["standard"]}
    e = resolve(OpsConfig(), "cpu", registry=reg, needs=need, load=False).get("swiglu", "standard")
    assert (e.kernel, e.distribution) == ("zzz", "veomni-triton")
    assert e.reason.endswith("tie at priority 30 with aaa@aaa-dist, broken by origin: first-party (veomni-*) "
                             "before third-party"), e.reason
    # Same origin and priority, same name from two distributions: distribution order, and the
    # reason says how to select the winner by name.
    reg2 = build_registry([("bbb-dist", more), ("aaa-dist", declared(make_plugin("a2", swiglu=[
        sw("bbb", hardware=ANY, priority=7)])))], include_entry_points=False, env={})
    e = resolve(OpsConfig(), "cpu", registry=reg2, needs=need, load=False).get("swiglu", "standard")
    assert e.distribution == "aaa-dist"
    assert "tie at priority 7 with bbb@bbb-dist, broken by distribution name order" in e.reason, e.reason
    assert e.reason.endswith("its name is contested: select it by name as bbb@aaa-dist"), e.reason


# -- 2. the plugin API version ---------------------------------------------------------------------


def test_the_core_publishes_its_plugin_api_version():
    import veomni_ops

    assert veomni_ops.PLUGIN_API_VERSION == PLUGIN_API_VERSION == "1.0"
    assert api_range_problem(">=1.0,<2") is None
    assert api_range_problem("==1.*") is None
    assert api_range_problem(">=2,<3") == ("core", ">=2,<3 does not include 1.0")
    assert api_range_problem("<1") == ("plugin", "<1 does not include 1.0")
    with pytest.raises(PluginAPIError, match="is not a version range"):
        api_range_problem("one point oh")


def test_a_backend_built_for_a_newer_api_is_a_load_failure_naming_both_versions():
    future = declared(make_plugin("vo-future", swiglu=[sw("vo_future")]), ">=2.0,<3")
    good = declared(make_plugin("good", swiglu=[sw("good")]))
    reg = build_registry([("vo-future", future), ("good", good)], include_entry_points=False, env={})
    (f,) = reg.failures
    assert (f.provenance.distribution, f.phase, type(f.error).__name__) == ("vo-future", "api", "PluginAPIError")
    assert ("vo-future local was built for veomni-ops plugin API >=2.0,<3 (VEOMNI_OPS_PLUGIN_API in vo-future), "
            "but this veomni-ops 0.1.0 provides plugin API 1.0: upgrade veomni-ops to a release whose plugin API "
            "is in >=2.0,<3") in f.message, f.message
    assert [k.spec.name for k in reg] == ["good"]  # the others go on
    status = {p.provenance.entry_point: (p.status, p.phase) for p in reg.plugins}
    assert status["vo-future"] == ("failed", "api")
    # A config that names its kernel is told why it is missing.
    with pytest.raises(ResolutionError, match="its plugin failed to load: plugin vo-future local .* failed at api"):
        resolve({"swiglu_mlp_implementation": "vo_future"}, "cpu", registry=reg, needs={"swiglu": ["standard"]})
    with pytest.raises(PluginLoadError, match="upgrade veomni-ops"):
        build_registry([("vo-future", future)], include_entry_points=False, env={"VEOMNI_OPS_STRICT": "1"})


def test_a_backend_built_for_an_older_api_says_to_upgrade_the_backend():
    old = declared(make_plugin("vo-old", swiglu=[sw("old")]), "<1")
    (f,) = build_registry([("vo-old", old)], include_entry_points=False, env={}).failures
    assert f.phase == "api"
    assert "upgrade vo-old to a release built for plugin API 1.0 (pip install -U vo-old)" in f.message, f.message


def test_an_invalid_range_is_a_load_failure():
    bad = declared(make_plugin("vo-bad", swiglu=[sw("bad")]), "version one")
    (f,) = build_registry([("vo-bad", bad)], include_entry_points=False, env={}).failures
    assert f.phase == "api" and "VEOMNI_OPS_PLUGIN_API='version one' is not a version range" in f.message


def test_a_backend_that_declares_nothing_loads_with_a_recorded_warning(caplog):
    plain = make_plugin("plain", swiglu=[sw("plain")])
    with caplog.at_level(logging.WARNING, logger="veomni_ops"):
        reg = build_registry([("plain", plain)], include_entry_points=False, env={})
    (rec,) = reg.plugins
    assert rec.status == "loaded" and [k.spec.name for k in reg] == ["plain"]
    (w,) = rec.warnings
    assert w.startswith("declares no plugin API range (VEOMNI_OPS_PLUGIN_API in plain); loaded as if built for "
                        "plugin API 1.0"), w
    assert rec.reason == w and f"plugin {rec.provenance}: {w}" in reg.notes
    assert "declares no plugin API range" in caplog.text


def test_the_core_reference_backend_needs_no_declaration():
    reg = build_registry([("veomni-ops", reference)], include_entry_points=False, env={})
    assert reg.plugins[0].warnings == () and reg.failures == []


# -- 3. hints that are true ------------------------------------------------------------------------


def test_the_npu_hint_names_torch_npu_and_cann(monkeypatch):
    monkeypatch.setattr(explain_mod, "_checkout_root", lambda: None)
    reg = build_registry([("veomni-ops", reference)], include_entry_points=False, env={})
    with pytest.raises(ResolutionError) as ei:
        resolve({"rms_norm_implementation": "npu"}, "npu", registry=reg, needs=STD, load=False)
    msg = str(ei.value)
    assert 'pip install "veomni-ops[npu]"' in msg
    assert "torch-npu" in msg and "Ascend CANN toolkit" in msg, msg


def test_a_disabled_kernel_is_reported_as_disabled_not_missing():
    liger = declared(make_plugin("veomni-liger", rms_norm=[rms("liger", hardware=ANY)]))
    reg = build_registry([("veomni-liger", liger)], include_entry_points=False,
                         env={"VEOMNI_OPS_DISABLE": "veomni-liger"})
    with pytest.raises(ResolutionError) as ei:
        resolve({"rms_norm_implementation": "liger"}, "cpu", registry=reg, needs=STD)
    msg = str(ei.value)
    assert ("no kernel 'liger' is registered for rms_norm: the plugin that provides it, veomni-liger local (entry "
            "point 'veomni-liger'), is not loaded: disabled by VEOMNI_OPS_DISABLE='veomni-liger'") in msg, msg
    assert "pip install" not in msg, msg
    assert msg.endswith("To use it, take veomni-liger / veomni-liger out of VEOMNI_OPS_DISABLE, or unset it."), msg
    reg = build_registry([("veomni-liger", liger)], include_entry_points=False, env={"VEOMNI_OPS_PLUGINS": ""})
    with pytest.raises(ResolutionError, match=r"is not loaded: not in VEOMNI_OPS_PLUGINS=''\. .*add veomni-liger to "
                                              r"VEOMNI_OPS_PLUGINS"):
        resolve({"rms_norm_implementation": "liger"}, "cpu", registry=reg, needs=STD)


@pytest.mark.parametrize("var", ["VEOMNI_OPS_PLUGINS", "VEOMNI_OPS_DISABLE"])
def test_a_switch_naming_an_uninstalled_plugin_warns_with_what_is_installed(caplog, var):
    mods = [("alpha-dist", declared(make_plugin("alpha", swiglu=[sw("alpha")])))]
    with caplog.at_level(logging.WARNING, logger="veomni_ops"):
        reg = build_registry(mods, include_entry_points=False, env={var: "alpha-dist, no-such-plugin"})
    want = (f"{var}='alpha-dist, no-such-plugin' names no-such-plugin, which is not an installed plugin (entry point "
            "or distribution); installed plugins: alpha-dist (alpha-dist)")
    assert want in reg.notes and want in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="veomni_ops"):
        reg = build_registry(mods, include_entry_points=False, env={var: "alpha-dist,eager"})
    assert reg.notes == [] and "not an installed plugin" not in caplog.text


def _ghost_registry(name: str):
    """A kernel whose module does not import, above a working one."""
    p = declared(make_plugin(name, swiglu=[sw("ghost", factory="vo_no_such_module_xyz:f", hardware=ANY, priority=9),
                                           sw("fine", factory="math:sqrt", hardware=ANY, priority=1)]))
    return build_registry([(name, p)], include_entry_points=False, env={})


def test_a_kernel_that_failed_to_import_is_not_offered_as_usable(monkeypatch):
    monkeypatch.delenv("VEOMNI_OPS_STRICT", raising=False)
    reg = _ghost_registry("ghostly-a")
    need = {"swiglu": ["standard"]}
    e = resolve(OpsConfig(), "cpu", registry=reg, needs=need).get("swiglu", "standard")
    assert e.kernel == "fine" and "passed over ghost (import failed: ModuleNotFoundError)" in e.reason
    with pytest.raises(ResolutionError) as ei:
        resolve({"swiglu_mlp_implementation": "ghost"}, "cpu", registry=reg, needs=need)
    msg = str(ei.value)
    assert "its kernel failed to import (ModuleNotFoundError" in msg
    assert "Usable here for swiglu/standard: fine." in msg, msg
    from veomni_ops.resolve import kernel_problem

    ghost = reg.get("swiglu", "standard", "ghost")
    assert kernel_problem(ghost, "cpu").startswith("its kernel failed to import (ModuleNotFoundError")
    assert kernel_problem(reg.get("swiglu", "standard", "fine"), "cpu") is None


def test_cli_plugins_does_not_list_a_kernel_that_fails_to_import_as_usable(monkeypatch, capsys):
    from veomni_ops import cli, discovery

    monkeypatch.delenv("VEOMNI_OPS_STRICT", raising=False)
    monkeypatch.setattr(discovery, "_cached", _ghost_registry("ghostly-b"))
    assert cli.main(["plugins", "--json"]) == 0
    kernels = {k["name"]: k for k in json.loads(capsys.readouterr().out)["kernels"]}
    assert kernels["ghost"]["usable"] is False
    assert kernels["ghost"]["why_not"].startswith("its kernel failed to import (ModuleNotFoundError"), kernels["ghost"]
    assert kernels["fine"]["usable"] is True


def test_strict_mode_makes_a_kernel_import_failure_fatal(monkeypatch):
    monkeypatch.setenv("VEOMNI_OPS_STRICT", "1")
    reg = _ghost_registry("ghostly-c")
    need = {"swiglu": ["standard"]}
    for cfg in ({}, {"swiglu_mlp_implementation": "ghost"}):
        with pytest.raises(PluginLoadError) as ei:
            resolve(cfg, "cpu", registry=reg, needs=need)
        assert "kernel 'ghost' for swiglu/standard (ghostly-c local (entry point 'ghostly-c')) failed to import" \
               in str(ei.value)
        assert "VEOMNI_OPS_STRICT=1 makes a kernel that fails to import fatal" in str(ei.value)
        assert isinstance(ei.value.__cause__, ModuleNotFoundError)


def _fake_checkout(tmp_path):
    root = tmp_path / "checkout"
    (root / "plugins" / "veomni-liger").mkdir(parents=True)
    (root / "plugins" / "veomni-liger" / "pyproject.toml").write_text("[project]\nname = 'veomni-liger'\n")
    return root


def test_from_a_source_checkout_the_hint_installs_the_plugin_from_it(monkeypatch, tmp_path):
    root = _fake_checkout(tmp_path)
    monkeypatch.setattr(explain_mod, "_checkout_root", lambda: root)
    monkeypatch.chdir(root)
    reg = build_registry([("veomni-ops", reference)], include_entry_points=False, env={})
    with pytest.raises(ResolutionError) as ei:
        resolve({"rms_norm_implementation": "liger"}, "cpu", registry=reg, needs=STD, load=False)
    assert ('To get it: pip install -e plugins/veomni-liger (this veomni-ops runs from a source checkout; from the '
            'index: pip install "veomni-ops[liger]").') in str(ei.value), str(ei.value)
    # A registered kernel whose requirement is missing: the spec's hint, with the checkout's way.
    liger = declared(make_plugin("veomni-liger", rms_norm=[rms("liger", requires=("vo-no-such-dist>=1",),
                                                              install_hint='pip install "veomni-ops[liger]"')]))
    reg = build_registry([("veomni-liger", liger)], include_entry_points=False, env={})
    with pytest.raises(ResolutionError) as ei:
        resolve({"rms_norm_implementation": "liger"}, "cpu", registry=reg, needs=STD, load=False)
    assert "To get it: pip install -e plugins/veomni-liger (from this source checkout; from the index: pip install " \
           '"veomni-ops[liger]")' in str(ei.value), str(ei.value)
    # Elsewhere the absolute path; without a checkout only the index.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert f"pip install -e {root / 'plugins' / 'veomni-liger'} " in resolve_mod.install_hint("liger")
    monkeypatch.setattr(explain_mod, "_checkout_root", lambda: None)
    assert resolve_mod.install_hint("liger") == 'To get it: pip install "veomni-ops[liger]".'
