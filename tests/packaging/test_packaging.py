"""Real packaging: wheels built from this checkout, installed into a fresh venv, discovered
through their entry points, and driven through the public API and the ``veomni-ops`` CLI.

The venv (see ``conftest.py``) holds the core, every real plugin in ``plugins/`` and the
fault-injection distributions in ``tests/fixtures/dists/``. Error texts are asserted on
the substrings a user relies on; ``tests/README.md`` lists each case and its text.

Run: cd /work/main && PYTHONPATH=core/src /work/venv/bin/pytest tests/packaging -q -m packaging
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[2]

#: Prints, as its last line, the registry the process-wide discover() built.
DUMP = """
import json
import veomni_ops
reg = veomni_ops.discover()
print(json.dumps({
    "plugins": [p.to_dict() for p in reg.plugins],
    "failures": [
        {"distribution": f.provenance.distribution, "version": f.provenance.version,
         "entry_point": f.provenance.entry_point, "phase": f.phase, "type": type(f.error).__name__,
         "message": f.message, "describe": f.describe()}
        for f in reg.failures
    ],
    "kernels": [[*k.key, k.provenance.distribution, k.provenance.version, k.provenance.entry_point] for k in reg],
}))
"""

#: Fixture entry points that must fail, whatever else is installed.
FAULTY_ENTRY_POINTS = {"broken", "raising", "misspelt", "invalid", "invalid_op", "future"}

#: Modules discovery must never import (vendor libraries of our plugins).
VENDOR_MODULES = ("liger_kernel", "triton", "quack", "flash_attn", "flash_attn_interface", "torch_npu", "cutlass")

#: Without vo-duplicate, vo-good-backend is the only provider of "acme".
NO_DUP = {"VEOMNI_OPS_DISABLE": "vo-duplicate"}


def resolve_code(config: dict, needs: dict | None, device: str | None = None, load: bool = True,
                 check_requires: bool | None = None) -> str:
    """A snippet that resolves ``config`` and prints the plan or the error, plus which fixture
    modules got imported (to prove a refusal happens before any import). ``check_requires``:
    resolve's (None: checked only for this machine's device)."""
    return f"""
import json, sys
import veomni_ops
from veomni_ops.resolve import ResolutionError
try:
    plan = veomni_ops.resolve({config!r}, {device!r}, needs={needs!r}, load={load!r}, check_requires={check_requires!r})
except ResolutionError as e:
    out = {{"ok": False, "error": str(e),
            "cause_type": type(e.__cause__).__name__ if e.__cause__ is not None else None,
            "cause": str(e.__cause__) if e.__cause__ is not None else None}}
else:
    out = {{"ok": True, "plan": plan.to_dict(), "table": plan.table()}}
out["modules"] = sorted(m for m in sys.modules if m.startswith("vo_"))
print(json.dumps(out))
"""


def failure(dump: dict, entry_point: str) -> dict:
    got = [f for f in dump["failures"] if f["entry_point"] == entry_point]
    assert len(got) == 1, f"expected one load failure for entry point {entry_point!r}, got {dump['failures']}"
    return got[0]


def record(dump: dict, entry_point: str) -> dict:
    got = [p for p in dump["plugins"] if p["entry_point"] == entry_point]
    assert len(got) == 1, f"expected one plugin record for entry point {entry_point!r}, got {dump['plugins']}"
    return got[0]


def kernels_of(dump: dict, distribution: str) -> set[tuple[str, str, str]]:
    return {tuple(k[:3]) for k in dump["kernels"] if k[3] == distribution}


@pytest.fixture
def needs_reference(pkg) -> None:
    """The core wheel must ship its reference backend: a test that needs it FAILS without it.

    (Overrides ``conftest.needs_reference``, which skipped while the backend was being
    written: a wheel that lost ``veomni_ops.backends.reference`` -- a packaging bug that
    leaves the ``eager`` entry point dangling -- must not turn these tests into skips.)
    """
    if not pkg.has_reference:
        pytest.fail(
            "veomni_ops.backends.reference is missing from the installed veomni-ops wheel: the core's 'eager' "
            "entry point cannot load; check core/pyproject.toml's package data and the wheel's file list"
        )


@pytest.fixture(scope="session")
def dump_all(pkg) -> dict:
    """Discovery with every distribution installed and no switch set."""
    return pkg.py_json(DUMP)


@pytest.fixture(scope="session")
def dump_no_dup(pkg) -> dict:
    return pkg.py_json(DUMP, env=NO_DUP)


# -- installation ----------------------------------------------------------------------------


def test_installed_from_wheels_not_from_the_checkout(pkg) -> None:
    out = pkg.py_json(
        """
        import json, sys
        from importlib import metadata
        import veomni_ops, vo_good_backend
        eps = sorted((ep.name, ep.value, ep.dist.metadata["Name"])
                     for ep in metadata.entry_points(group="veomni_ops.backends"))
        print(json.dumps({"core": veomni_ops.__file__, "good": vo_good_backend.__file__, "prefix": sys.prefix,
                          "version": metadata.version("veomni-ops"), "eps": eps}))
        """
    )
    site = str(pkg.venv)
    assert out["core"].startswith(site) and "site-packages" in out["core"], out["core"]
    assert out["good"].startswith(site) and "site-packages" in out["good"], out["good"]
    assert out["version"] == "0.1.0"
    eps = {tuple(e) for e in out["eps"]}
    for expected in [
        ("eager", "veomni_ops.backends.reference", "veomni-ops"),
        ("acme", "vo_good_backend.specs", "vo-good-backend"),
        ("broken", "vo_broken_import.specs", "vo-broken-import"),
        ("raising", "vo_raising_hook.specs", "vo-raising-hook"),
        ("misspelt", "vo_misspelt_hook.specs", "vo-misspelt-hook"),
        ("dup", "vo_duplicate.specs", "vo-duplicate"),
        ("wrongdev", "vo_wrong_device.specs", "vo-wrong-device"),
        ("invalid", "vo_invalid_spec.specs", "vo-invalid-spec"),
        ("invalid_op", "vo_invalid_spec.wrong_op", "vo-invalid-spec"),
    ]:
        assert expected in eps, f"entry point {expected} not installed; have {sorted(eps)}"
    installed_real = {e[2] for e in eps} & set(pkg.real_plugins)
    assert installed_real == set(pkg.real_plugins), "a plugin in plugins/ declares no veomni_ops.backends entry point"
    print("install notes:", json.dumps(pkg.install_notes, indent=1))


# -- discovery: the good plugin and every fault ----------------------------------------------


def test_core_wheel_ships_and_loads_its_reference_backend(pkg, dump_all, needs_reference) -> None:
    """The ``eager`` entry point of the core wheel loads and registers the reference kernels."""
    rec = record(dump_all, "eager")
    assert (rec["distribution"], rec["status"]) == ("veomni-ops", "loaded"), rec
    ops = {op for op, _variant, name in kernels_of(dump_all, "veomni-ops") if name == "eager"}
    assert ops == {"rms_norm", "residual_rms_norm", "rotary", "swiglu", "cross_entropy", "moe_router", "moe_experts",
                   "load_balancing_loss", "attention"}, ops


def test_good_backend_kernels_discovered(dump_no_dup) -> None:
    rec = record(dump_no_dup, "acme")
    assert rec["status"] == "loaded", rec
    assert rec["distribution"] == "vo-good-backend" and rec["version"] == "0.1.0"
    want = {("swiglu", "standard", "acme"), ("rms_norm", "standard", "acme"),
            ("rms_norm", "standard", "acme_needs_missing")}
    assert {tuple(k) for k in rec["kernels"]} == want
    assert kernels_of(dump_no_dup, "vo-good-backend") == want
    for k in dump_no_dup["kernels"]:
        if k[3] == "vo-good-backend":
            assert k[4:] == ["0.1.0", "acme"], f"provenance of {k[:3]} is {k[3:]}"


def test_broken_import_is_recorded_and_others_load(dump_all) -> None:
    f = failure(dump_all, "broken")
    assert (f["distribution"], f["version"], f["phase"], f["type"]) == (
        "vo-broken-import", "0.1.0", "import", "ModuleNotFoundError")
    assert f["message"] == "ModuleNotFoundError: No module named 'vo_this_module_does_not_exist'"
    assert f["describe"] == (
        "plugin vo-broken-import 0.1.0 (entry point 'broken') failed at import: "
        "ModuleNotFoundError: No module named 'vo_this_module_does_not_exist'"
    )
    assert record(dump_all, "broken")["status"] == "failed"
    assert record(dump_all, "wrongdev")["status"] == "loaded"


def test_raising_hook_is_recorded_and_registers_nothing(dump_all) -> None:
    f = failure(dump_all, "raising")
    assert (f["distribution"], f["version"], f["phase"], f["type"]) == (
        "vo-raising-hook", "0.1.0", "hook:rms_norm", "RuntimeError")
    assert f["message"] == "RuntimeError: boom from hook"
    assert f["describe"] == "plugin vo-raising-hook 0.1.0 (entry point 'raising') failed at hook:rms_norm: " \
                            "RuntimeError: boom from hook"
    # Its swiglu hook worked, but a plugin registers whole or not at all.
    assert kernels_of(dump_all, "vo-raising-hook") == set()


def test_misspelt_hook_is_an_error_naming_it(dump_all) -> None:
    f = failure(dump_all, "misspelt")
    assert (f["distribution"], f["version"], f["phase"], f["type"]) == (
        "vo-misspelt-hook", "0.1.0", "hooks", "PluginHookError")
    assert "unknown hook 'rms_nrom'" in f["message"], f["message"]
    assert f["message"].endswith(
        "(the hooks a backend may implement are: rms_norm, residual_rms_norm, rotary, swiglu, cross_entropy, moe_router, "
        "moe_experts, load_balancing_loss, attention)"), f["message"]
    assert kernels_of(dump_all, "vo-misspelt-hook") == set()


def test_duplicate_kernel_names_both_distributions(pkg, dump_all) -> None:
    """Two distributions registering swiglu "acme": neither fails, the bare name is contested
    and refused naming both (it used to go to whichever distribution sorted first)."""
    assert not [f for f in dump_all["failures"] if f["entry_point"] in ("acme", "dup")], dump_all["failures"]
    assert ("swiglu", "standard", "acme") in kernels_of(dump_all, "vo-good-backend")
    assert kernels_of(dump_all, "vo-duplicate") == {("swiglu", "standard", "acme")}
    out = pkg.py_json(resolve_code({"swiglu_mlp_implementation": "acme"}, {"swiglu": ["standard"]}))
    assert not out["ok"]
    msg = out["error"]
    assert ("swiglu_mlp_implementation='acme' (op swiglu, variant standard): kernel name 'acme' is registered for "
            "swiglu by 2 distributions, vo-duplicate 0.1.0 (entry point 'dup') and vo-good-backend 0.1.0 (entry point "
            "'acme'), so the bare name selects neither") in msg, msg
    assert ("Write the name qualified by its distribution: swiglu_mlp_implementation: acme@vo-duplicate or "
            "swiglu_mlp_implementation: acme@vo-good-backend.") in msg, msg
    assert "VEOMNI_OPS_DISABLE=<its distribution> (vo-duplicate / vo-good-backend)" in msg, msg


def test_invalid_spec_type_and_wrong_op_are_blamed_per_entry_point(dump_all) -> None:
    f = failure(dump_all, "invalid")
    assert (f["distribution"], f["phase"], f["type"]) == ("vo-invalid-spec", "validate", "TypeError")
    assert f["message"].startswith("TypeError: hook returned dict {"), f["message"]
    assert f["message"].endswith(", expected veomni_ops.KernelSpec"), f["message"]
    g = failure(dump_all, "invalid_op")
    assert (g["distribution"], g["phase"], g["type"]) == ("vo-invalid-spec", "hook:rms_norm", "ValueError")
    assert g["message"] == "ValueError: hook rms_norm() returned a spec for op 'swiglu' ('wrong_op')"
    assert kernels_of(dump_all, "vo-invalid-spec") == set()


def test_every_non_faulty_plugin_loads(pkg, dump_all) -> None:
    """The real plugins (whether or not their vendor library could be installed) and the good
    fixtures must load: a spec module that needs its vendor library is a bug."""
    expected_failures = set(FAULTY_ENTRY_POINTS)
    expected_failures |= {f["entry_point"] for f in dump_all["failures"] if f["entry_point"] in ("acme", "dup")}
    unexpected = [f["describe"] for f in dump_all["failures"] if f["entry_point"] not in expected_failures]
    assert not unexpected, "unexpected load failures:\n" + "\n".join(unexpected)
    for dist in pkg.real_plugins:
        recs = [p for p in dump_all["plugins"] if p["distribution"] == dist]
        assert recs and all(p["status"] == "loaded" for p in recs), (dist, recs, pkg.install_notes.get(dist))
        assert any(p["kernels"] for p in recs), f"{dist} loaded but registered no kernel"


# -- the CLI's view of discovery -----------------------------------------------------------------


def test_cli_plugins_json(pkg) -> None:
    proc = pkg.cli("plugins", "--json", env=NO_DUP)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["device"]["type"] == "cpu"
    assert isinstance(out["discovery_ms"], (int, float)) and out["discovery_ms"] >= 0
    by_ep = {p["entry_point"]: p for p in out["plugins"]}
    assert by_ep["broken"] == {
        "distribution": "vo-broken-import", "version": "0.1.0", "entry_point": "broken", "status": "failed",
        "reason": "ModuleNotFoundError: No module named 'vo_this_module_does_not_exist'", "kernels": [],
        **({"phase": "import"} if "phase" in by_ep["broken"] else {}),
    }
    assert by_ep["raising"]["reason"] == "RuntimeError: boom from hook"
    assert by_ep["dup"]["status"] == "disabled"
    assert by_ep["dup"]["reason"] == "disabled by VEOMNI_OPS_DISABLE='vo-duplicate'"
    usable = {(k["op"], k["name"]): (k["usable"], k["why_not"], k["distribution"]) for k in out["kernels"]}
    assert usable[("swiglu", "acme")] == (True, "", "vo-good-backend")
    assert usable[("rms_norm", "acme")] == (True, "", "vo-good-backend")
    assert usable[("rms_norm", "acme_needs_missing")] == (
        False, "requires definitely-not-installed-pkg>=1.0, which is not installed", "vo-good-backend")
    assert usable[("rms_norm", "npu_only")] == (False, "needs a npu device, this is cpu", "vo-wrong-device")
    assert usable[("rms_norm", "hopper_only")] == (False, "needs a cuda device, this is cpu", "vo-wrong-device")
    # Load failures are also logged on stderr, stdout stays pure JSON.
    assert ("veomni_ops: plugin vo-broken-import 0.1.0 (entry point 'broken') failed at import: "
            "ModuleNotFoundError: No module named 'vo_this_module_does_not_exist'") in proc.stderr, proc.stderr


def test_cli_plugins_json_records_failure_phase(pkg) -> None:
    """A user reading ``plugins --json`` must see where a plugin failed, not only the exception."""
    out = json.loads(pkg.cli("plugins", "--json").stdout)
    by_ep = {p["entry_point"]: p for p in out["plugins"]}
    phases = {ep: by_ep[ep].get("phase") for ep in ("broken", "raising", "misspelt", "invalid", "invalid_op")}
    assert phases == {"broken": "import", "raising": "hook:rms_norm", "misspelt": "hooks", "invalid": "validate",
                      "invalid_op": "hook:rms_norm"}, (
        "PluginRecord.to_dict() has no 'phase' for failed plugins; core/src/veomni_ops/registry.py PluginRecord "
        "should carry LoadFailure.phase (set in discovery.build_registry)")


def test_cli_plugins_text_and_device_option(pkg) -> None:
    proc = pkg.cli("plugins", "--device", "cuda:9.0", env=NO_DUP)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "device: cuda:9.0 (override cuda:9.0)" in text, text
    assert "vo-broken-import 0.1.0: failed - ModuleNotFoundError: No module named 'vo_this_module_does_not_exist'" \
        in text, text
    assert "vo-duplicate 0.1.0: disabled - disabled by VEOMNI_OPS_DISABLE='vo-duplicate'" in text, text
    lines = {ln.split()[2]: ln for ln in text.splitlines() if ln.startswith("  rms_norm ")}
    assert lines["hopper_only"].rstrip().endswith("yes"), lines["hopper_only"]
    assert "cuda sm9.0..9.0" in lines["hopper_only"], lines["hopper_only"]
    assert lines["npu_only"].rstrip().endswith("no: needs a npu device, this is cuda"), lines["npu_only"]


# -- resolution: refusals name the op, the reason and what can be had ----------------------------


def test_npu_only_refused_on_cpu(pkg) -> None:
    out = pkg.py_json(resolve_code({"rms_norm_implementation": "npu_only"}, {"rms_norm": ["standard"]}), env=NO_DUP)
    assert not out["ok"]
    err = out["error"]
    assert err.startswith("cannot resolve 1 op(s) for device cpu:\n  - "), err
    assert ("rms_norm_implementation='npu_only' (op rms_norm, variant standard): kernel 'npu_only' "
            "(vo-wrong-device 0.1.0 (entry point 'wrongdev')) needs a npu device, this is cpu.") in err, err
    usable = err.split("Usable here for rms_norm/standard: ")[1].split(".")[0].split(", ")
    assert "acme" in usable and not {"npu_only", "hopper_only", "acme_needs_missing"} & set(usable), usable
    assert err.endswith("Pick a kernel that runs on cpu, or 'auto'."), err
    assert "vo_wrong_device.kernels" not in out["modules"]


def test_hopper_only_refused_below_and_above_its_range(pkg) -> None:
    for dev, why in [("cuda:8.0", "needs compute capability >= 9.0, this device has 8.0"),
                     ("cuda:10.0", "needs compute capability <= 9.0, this device has 10.0"),
                     ("cpu", "needs a cuda device, this is cpu")]:
        out = pkg.py_json(resolve_code({"rms_norm_implementation": "hopper_only"}, {"rms_norm": ["standard"]},
                                       device=dev, load=False))
        assert not out["ok"], dev
        assert f"kernel 'hopper_only' (vo-wrong-device 0.1.0 (entry point 'wrongdev')) {why}." in out["error"], out


def test_missing_requirement_refused_before_import(pkg) -> None:
    out = pkg.py_json(resolve_code({"rms_norm_implementation": "acme_needs_missing"}, {"rms_norm": ["standard"]}),
                      env=NO_DUP)
    assert not out["ok"]
    assert ("rms_norm_implementation='acme_needs_missing' (op rms_norm, variant standard): kernel "
            "'acme_needs_missing' (vo-good-backend 0.1.0 (entry point 'acme')) requires "
            "definitely-not-installed-pkg>=1.0, which is not installed.") in out["error"], out["error"]
    assert out["error"].endswith("To get it: pip install definitely-not-installed-pkg."), out["error"]
    assert "vo_good_backend.kernels" not in out["modules"], "the factory was imported before the requirement check"


def test_satisfied_requirement_resolves_and_loads(pkg) -> None:
    out = pkg.py_json(resolve_code({"rms_norm_implementation": "acme"}, {"rms_norm": ["standard"]}), env=NO_DUP)
    assert out["ok"], out
    (entry,) = out["plan"]["entries"]
    assert (entry["kernel"], entry["distribution"], entry["version"], entry["reason"]) == (
        "acme", "vo-good-backend", "0.1.0", "requested by name")
    assert entry["factory"] == "vo_good_backend.kernels:rms_norm"
    assert "vo_good_backend.kernels" in out["modules"]


def test_auto_passes_over_unusable_kernels_and_says_why(pkg) -> None:
    only = {"VEOMNI_OPS_PLUGINS": "vo-good-backend,vo-wrong-device"}
    out = pkg.py_json(resolve_code({}, {"rms_norm": ["standard"]}), env=only)
    assert out["ok"], out
    (entry,) = out["plan"]["entries"]
    assert (entry["requested"], entry["kernel"], entry["distribution"]) == ("auto", "acme", "vo-good-backend")
    assert entry["reason"] == (
        "auto: highest priority usable here (priority 50); passed over hopper_only (needs a cuda device, this is "
        "cpu), npu_only (needs a npu device, this is cpu), acme_needs_missing (requires "
        "definitely-not-installed-pkg>=1.0, which is not installed)"
    )
    assert "vo_wrong_device.kernels" not in out["modules"]


def test_unknown_kernel_name_did_you_mean(pkg) -> None:
    out = pkg.py_json(resolve_code({"rms_norm_implementation": "acmee"}, {"rms_norm": ["standard"]}), env=NO_DUP)
    assert not out["ok"]
    assert "rms_norm_implementation='acmee' (op rms_norm, variant standard): no kernel 'acmee' is registered for " \
           "rms_norm (did you mean 'acme'?)" in out["error"], out["error"]
    # A failed plugin might be the one that provides it: the refusal says so.
    assert "; note that these plugins failed to load: " in out["error"]
    assert "vo-broken-import 0.1.0 (entry point 'broken')" in out["error"]


def test_kernel_of_a_failed_plugin_is_explained_and_chained(pkg) -> None:
    out = pkg.py_json(resolve_code({"swiglu_mlp_implementation": "raising"}, {"swiglu": ["standard"]}))
    assert not out["ok"]
    assert ("swiglu_mlp_implementation='raising' (op swiglu, variant standard): no kernel 'raising' is registered "
            "for swiglu; its plugin failed to load: plugin vo-raising-hook 0.1.0 (entry point 'raising') failed at "
            "hook:rms_norm: RuntimeError: boom from hook.") in out["error"], out["error"]
    assert out["error"].endswith("Fix or reinstall the failing plugin (see the chained exception).")
    assert (out["cause_type"], out["cause"]) == ("RuntimeError", "boom from hook")


def test_acme_swiglu_is_a_correct_kernel_from_the_installed_wheel(pkg) -> None:
    """Resolve ``auto`` with only the good plugin, load its kernel from the wheel, and check it
    against a float64 reference, forward and backward, including odd and non-contiguous inputs."""
    out = pkg.py_json(
        """
        import json, torch, veomni_ops
        plan = veomni_ops.resolve({}, needs={"swiglu": ["standard"]})
        entry = plan.get("swiglu", "standard")
        fn = plan.kernel("swiglu", "standard")

        def ref(g, u):  # float64, by hand: silu(g) = g * sigmoid(g)
            g, u = g.double(), u.double()
            s = torch.sigmoid(g)
            return g * s * u, u * (s + g * s * (1 - s)), g * s

        errs = []
        torch.manual_seed(0)
        for dtype, shape, tol in [(torch.float32, (7, 13), (1e-5, 1e-4)), (torch.float32, (2, 5, 33), (1e-5, 1e-4)),
                                  (torch.bfloat16, (3, 64), (2e-2, 2e-2)), (torch.float64, (4, 9), (1e-10, 1e-8))]:
            for noncontig in (False, True):
                g = torch.randn(*shape, dtype=dtype) * 3
                u = torch.randn(*shape, dtype=dtype)
                if noncontig:
                    g, u = g.transpose(0, -1), u.transpose(0, -1)
                g.requires_grad_(True); u.requires_grad_(True)
                y = fn(g, u)
                dy = torch.randn_like(y)
                y.backward(dy)
                r, dg, du = ref(g.detach(), u.detach())
                for name, a, b in [("y", y, r), ("dgate", g.grad, dg * dy.double()), ("dup", u.grad, du * dy.double())]:
                    atol, rtol = tol
                    ok = a.dtype == dtype and a.shape == b.shape and torch.allclose(a.double(), b, atol=atol, rtol=rtol)
                    if not ok:
                        errs.append(f"{dtype} {shape} noncontig={noncontig} {name}: max err "
                                    f"{(a.double() - b).abs().max().item()}, dtype {a.dtype}")
        g = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
        u = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
        grad_ok = torch.autograd.gradcheck(fn, (g, u))
        try:
            fn(torch.randn(3, 4), torch.randn(3, 5))
            shape_error = None
        except ValueError as e:
            shape_error = str(e)
        print(json.dumps({"kernel": entry.kernel, "dist": entry.distribution, "fn": fn.__module__ + "." + fn.__name__,
                          "errs": errs, "gradcheck": grad_ok, "shape_error": shape_error}))
        """,
        env={"VEOMNI_OPS_PLUGINS": "vo-good-backend"},
    )
    assert (out["kernel"], out["dist"], out["fn"]) == ("acme", "vo-good-backend", "vo_good_backend.kernels.silu_mul")
    assert out["errs"] == []
    assert out["gradcheck"] is True
    assert out["shape_error"] == "acme silu_mul: gate (3, 4) and up (3, 5) must have one shape"


# -- environment switches ------------------------------------------------------------------------


def test_strict_mode_makes_discovery_raise(pkg) -> None:
    code = """
    import json, veomni_ops
    try:
        veomni_ops.discover()
    except veomni_ops.PluginLoadError as e:
        print(json.dumps({"raised": True, "message": str(e), "cause": type(e.__cause__).__name__}))
    else:
        print(json.dumps({"raised": False}))
    """
    out = pkg.py_json(code, env={"VEOMNI_OPS_STRICT": "1"})
    assert out["raised"], "VEOMNI_OPS_STRICT=1 with failing plugins installed did not raise PluginLoadError"
    assert "(VEOMNI_OPS_STRICT=1 makes every plugin load failure fatal; fix or uninstall the plugin, or disable " \
           "it with VEOMNI_OPS_DISABLE=" in out["message"], out["message"]
    assert out["cause"] != "NoneType"
    # Not strict: the same installation discovers without raising.
    assert not pkg.py_json(code)["raised"]


def test_strict_mode_names_the_failing_plugin_and_chains(pkg, needs_reference) -> None:
    code = """
    import json, veomni_ops
    try:
        veomni_ops.discover()
    except veomni_ops.PluginLoadError as e:
        print(json.dumps({"raised": True, "message": str(e), "cause": type(e.__cause__).__name__}))
    else:
        print(json.dumps({"raised": False}))
    """
    out = pkg.py_json(code, env={"VEOMNI_OPS_STRICT": "1", "VEOMNI_OPS_PLUGINS": "vo-raising-hook"})
    assert out["raised"]
    assert out["message"] == (
        "plugin vo-raising-hook 0.1.0 (entry point 'raising') failed at hook:rms_norm: RuntimeError: boom from hook\n"
        "(VEOMNI_OPS_STRICT=1 makes every plugin load failure fatal; fix or uninstall the plugin, or disable it "
        "with VEOMNI_OPS_DISABLE=raising)"
    )
    assert out["cause"] == "RuntimeError"
    ok = pkg.py_json(code, env={"VEOMNI_OPS_STRICT": "1", "VEOMNI_OPS_PLUGINS": "vo-good-backend,vo-wrong-device"})
    assert ok == {"raised": False}


def test_strict_mode_cli_exit_code(pkg) -> None:
    proc = pkg.cli("plugins", "--json", env={"VEOMNI_OPS_STRICT": "1"})
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert json.loads(proc.stdout)["kind"] == "PluginLoadError"  # --json: the error as JSON too
    assert "veomni-ops plugins: plugin " in proc.stderr and "VEOMNI_OPS_STRICT=1 makes every plugin load failure " \
           "fatal" in proc.stderr, proc.stderr


@pytest.mark.parametrize("allow", ["vo-good-backend", "acme", "VO_Good_Backend"])
def test_allowlist_loads_only_the_named_plugin_and_the_core(pkg, allow) -> None:
    dump = pkg.py_json(DUMP, env={"VEOMNI_OPS_PLUGINS": allow})
    for p in dump["plugins"]:
        if p["distribution"] == "veomni-ops":
            assert p["status"] == "loaded", p  # always tried, never disabled, and its reference backend loads
        elif p["distribution"] == "vo-good-backend":
            assert p["status"] == "loaded", p
        else:
            assert p["status"] == "disabled", p
            assert p["reason"] == f"not in VEOMNI_OPS_PLUGINS={allow!r}", p
    assert not dump["failures"], dump["failures"]
    assert {k[3] for k in dump["kernels"]} <= {"vo-good-backend", "veomni-ops"}
    assert kernels_of(dump, "vo-good-backend")


def test_empty_allowlist_loads_only_the_core(pkg) -> None:
    dump = pkg.py_json(DUMP, env={"VEOMNI_OPS_PLUGINS": ""})
    others = [p for p in dump["plugins"] if p["distribution"] != "veomni-ops"]
    assert others and all(p["status"] == "disabled" and p["reason"] == "not in VEOMNI_OPS_PLUGINS=''"
                          for p in others), others
    assert {k[3] for k in dump["kernels"]} <= {"veomni-ops"}


def test_denylist_disables_by_entry_point_or_distribution(pkg) -> None:
    deny = "broken, vo-raising-hook"
    dump = pkg.py_json(DUMP, env={"VEOMNI_OPS_DISABLE": deny})
    for ep in ("broken", "raising"):
        rec = record(dump, ep)
        assert (rec["status"], rec["reason"]) == ("disabled", f"disabled by VEOMNI_OPS_DISABLE={deny!r}"), rec
    assert not [f for f in dump["failures"] if f["entry_point"] in ("broken", "raising")]
    assert record(dump, "misspelt")["status"] == "failed"
    assert record(dump, "wrongdev")["status"] == "loaded"


def test_device_override_resolves_hopper_only_without_importing_it(pkg) -> None:
    cfg, needs = {"rms_norm_implementation": "hopper_only"}, {"rms_norm": ["standard"]}
    for env, device in [({"VEOMNI_OPS_DEVICE": "cuda:9.0"}, None), ({}, "cuda:sm90")]:
        out = pkg.py_json(resolve_code(cfg, needs, device=device, load=False), env=env)
        assert out["ok"], out
        assert out["plan"]["device"] == {"type": "cuda", "capability": [9, 0], "name": out["plan"]["device"]["name"],
                                         "overridden": True}
        (entry,) = out["plan"]["entries"]
        assert (entry["kernel"], entry["distribution"], entry["version"], entry["reason"]) == (
            "hopper_only", "vo-wrong-device", "0.1.0", "requested by name")
        # Its kernel module raises on import: resolution for another device must not import it.
        assert "vo_wrong_device.kernels" not in out["modules"]


def test_trace_logs_every_hook_call(pkg) -> None:
    code = """
    import logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
    import veomni_ops
    veomni_ops.discover()
    """
    env = {"VEOMNI_OPS_TRACE": "1", "VEOMNI_OPS_PLUGINS": "vo-good-backend,vo-broken-import", **NO_DUP}
    proc = pkg.py(code, env=env)
    assert proc.returncode == 0, proc.stderr
    log = proc.stdout
    for line in ["veomni_ops veomni_ops: loaded acme from vo_good_backend.specs",
                 "veomni_ops veomni_ops: call acme.rms_norm()",
                 "veomni_ops veomni_ops: call acme.swiglu()",
                 "veomni_ops veomni_ops: skip vo-duplicate 0.1.0 (entry point 'dup'): not in "
                 "VEOMNI_OPS_PLUGINS='vo-good-backend,vo-broken-import'",
                 "veomni_ops veomni_ops: plugin vo-broken-import 0.1.0 (entry point 'broken') failed at import"]:
        assert line in log, f"missing trace line {line!r} in:\n{log}"
    quiet = pkg.py(code, env={k: v for k, v in env.items() if k != "VEOMNI_OPS_TRACE"})
    assert "call acme.swiglu()" not in quiet.stdout


def test_trace_is_visible_from_the_cli(pkg) -> None:
    """``VEOMNI_OPS_TRACE=1 veomni-ops plugins`` must show the trace without any logging setup."""
    proc = pkg.cli("plugins", env={"VEOMNI_OPS_TRACE": "1", "VEOMNI_OPS_PLUGINS": "vo-good-backend"})
    assert proc.returncode == 0, proc.stderr
    assert "call acme.swiglu()" in proc.stderr + proc.stdout, (
        "VEOMNI_OPS_TRACE=1 printed nothing: discovery logs the trace at INFO on logger 'veomni_ops', which has no "
        "handler in the CLI (Python's last-resort handler shows WARNING and above only). Fix in "
        "core/src/veomni_ops/discovery.py build_registry: when trace is on and the logger has no handler, attach a "
        f"stderr StreamHandler at INFO.\nstderr was:\n{proc.stderr}")


# -- CLI resolve and exit codes --------------------------------------------------------------------


def test_cli_config_unknown_field_did_you_mean(pkg) -> None:
    flat = pkg.write("typo.yaml", "rms_norm_implmentation: acme\n")
    nested = pkg.write("typo_nested.yaml", """
        model:
          ops_implementation:
            swiglu_mlp_implementaton: acme
        """)
    for path, msg in [(flat, "unknown ops_implementation field 'rms_norm_implmentation'; did you mean "
                             "'rms_norm_implementation'?"),
                      (nested, "unknown ops_implementation field 'swiglu_mlp_implementaton'; did you mean "
                               "'swiglu_mlp_implementation'?")]:
        proc = pkg.cli("resolve", str(path))
        assert proc.returncode == 1, (proc.returncode, proc.stderr)
        assert proc.stdout == ""
        assert f"veomni-ops resolve: {msg}" in proc.stderr, proc.stderr


def test_cli_refusal_exit_1_with_explanation_on_stderr(pkg) -> None:
    cfg = pkg.write("npu.yaml", "rms_norm_implementation: npu_only\n")
    proc = pkg.cli("resolve", str(cfg), env=NO_DUP)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert "veomni-ops resolve: cannot resolve " in proc.stderr, proc.stderr
    assert ("  - rms_norm_implementation='npu_only' (op rms_norm, variant standard): kernel 'npu_only' "
            "(vo-wrong-device 0.1.0 (entry point 'wrongdev')) needs a npu device, this is cpu.") in proc.stderr
    proc = pkg.cli("resolve", str(cfg), "--device", "cuda:8.0", "--json", env=NO_DUP)
    assert proc.returncode == 1 and json.loads(proc.stdout)["kind"] == "ResolutionError"
    assert "needs a npu device, this is cuda." in proc.stderr, proc.stderr


def test_cli_usage_errors(pkg) -> None:
    cfg = pkg.write("empty.yaml", "{}\n")
    bad_device = pkg.cli("resolve", str(cfg), "--device", "warp9")
    assert bad_device.returncode == 1
    assert "veomni-ops resolve: unknown device 'warp9'; write one of cuda[:MAJOR.MINOR]" in bad_device.stderr
    missing = pkg.cli("resolve", str(pkg.workdir / "no-such.yaml"))
    assert missing.returncode == 1
    assert f"veomni-ops resolve: {pkg.workdir / 'no-such.yaml'}: no such file" in missing.stderr, missing.stderr
    for argv in (["resolve"], ["no-such-command"], []):
        proc = pkg.cli(*argv)
        assert proc.returncode == 2, (argv, proc.returncode, proc.stderr)
        assert "usage: veomni-ops" in proc.stderr


def test_cli_resolve_for_another_device(pkg, needs_reference) -> None:
    cfg = pkg.write("hopper.yaml", """
        model:
          ops_implementation:
            rms_norm_implementation: hopper_only
            swiglu_mlp_implementation: acme
        """)
    for extra_args, env in [(["--device", "cuda:9.0"], NO_DUP), ([], {"VEOMNI_OPS_DEVICE": "cuda:9.0", **NO_DUP})]:
        proc = pkg.cli("resolve", str(cfg), "--json", *extra_args, env=env)
        assert proc.returncode == 0, proc.stderr
        plan = json.loads(proc.stdout)
        assert plan["device"]["type"] == "cuda" and plan["device"]["capability"] == [9, 0]
        assert plan["device"]["overridden"] is True
        got = {(e["op"], e["variant"]): e for e in plan["entries"]}
        assert (got[("rms_norm", "standard")]["kernel"], got[("rms_norm", "standard")]["distribution"]) == (
            "hopper_only", "vo-wrong-device")
        assert ("rms_norm", "offset") not in got  # hopper_only provides only "standard"
        assert (got[("swiglu", "standard")]["kernel"], got[("swiglu", "standard")]["distribution"]) == (
            "acme", "vo-good-backend")
        assert {op for op, _ in got} == {"rms_norm", "residual_rms_norm", "rotary", "swiglu", "cross_entropy", "moe_router",
                                         "moe_experts", "load_balancing_loss", "attention"}
    table = pkg.cli("resolve", str(cfg), "--device", "cuda:9.0", env=NO_DUP)
    assert table.returncode == 0
    assert table.stdout.startswith("KernelPlan for cuda:9.0 (override cuda:9.0)")


def test_cli_resolve_default_config_on_cpu(pkg, needs_reference) -> None:
    cfg = pkg.write("auto.yaml", "{}\n")
    proc = pkg.cli("resolve", str(cfg), "--json", env=NO_DUP)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    got = {(e["op"], e["variant"]): e for e in plan["entries"]}
    assert got[("swiglu", "standard")]["kernel"] == "acme"  # priority 50 beats the core's eager
    assert got[("rms_norm", "standard")]["kernel"] == "acme"


# -- discovery stays light ------------------------------------------------------------------------


def test_discovery_imports_no_vendor_library_and_no_kernel(pkg) -> None:
    """After discovering every installed plugin, no vendor library (and no plugin's kernels
    package) was imported, or even looked for (a meta-path spy sees failed imports too)."""
    out = pkg.py_json(
        f"""
        import json, sys
        VENDOR = {VENDOR_MODULES!r}
        attempted = []

        class Spy:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in VENDOR:
                    attempted.append(name)
                return None

        sys.meta_path.insert(0, Spy())
        import veomni_ops
        reg = veomni_ops.discover()
        from importlib import metadata
        # Each plugin's top-level package (veomni_ops for the core): its "kernels" subpackage is heavy.
        tops = {{ep.value.split(":")[0].split(".")[0] for ep in metadata.entry_points(group="veomni_ops.backends")}}
        kernel_modules = sorted(m for m in sys.modules for t in tops
                                if m == t + ".kernels" or m.startswith(t + ".kernels."))
        print(json.dumps({{
            "vendor_imported": sorted(m for m in sys.modules if m.split(".")[0] in VENDOR),
            "vendor_attempted": sorted(set(attempted)),
            "kernel_modules": kernel_modules,
            "torch_imported": "torch" in sys.modules,
            "loaded": sorted(p.provenance.distribution + ":" + p.provenance.entry_point
                             for p in reg.plugins if p.status == "loaded"),
        }}))
        """
    )
    print("discovery loaded:", out["loaded"], "| torch imported by discovery:", out["torch_imported"])
    for dist in pkg.real_plugins:
        assert any(x.startswith(dist + ":") for x in out["loaded"]), f"{dist} did not load: {out['loaded']}"
    assert out["vendor_imported"] == [], out
    assert out["vendor_attempted"] == [], out
    assert out["kernel_modules"] == [], out


# -- discovery cost (recorded, not asserted) ------------------------------------------------------


def test_discovery_cost_benchmark_runs(pkg, tmp_path) -> None:
    runs = os.environ.get("VEOMNI_BENCH_RUNS", "20")
    result = tmp_path / "discovery_cost.json"
    proc = pkg.run([pkg.python, REPO / "benchmarks" / "discovery_cost.py", "--runs", runs, "--warmup", "1",
                    "--json", result], timeout=1800)
    assert proc.returncode == 0, proc.stderr
    print("\n" + proc.stdout)
    data = json.loads(result.read_text())
    assert data["runs"] == int(runs)
    for key in ("import_torch_ms", "import_torch_and_discover_ms", "overhead_ms", "overhead_cpu_ms"):
        assert isinstance(data[key], (int, float)), key
    assert data["plugins_loaded"], data


# -- names nobody takes silently, the plugin API version, hints that are true -----------------------

#: Prints, as its last line, discovery's warnings and every plugin record.
NOTES = """
import json
import veomni_ops
reg = veomni_ops.discover()
print(json.dumps({"notes": reg.notes, "plugins": [p.to_dict() for p in reg.plugins]}))
"""


def test_squatter_and_veomni_liger_both_load_and_liger_is_contested(pkg, dump_all) -> None:
    """vo-squatter registers rms_norm ``liger`` under an entry point also named ``liger``."""
    recs = {p["distribution"]: p for p in dump_all["plugins"] if p["entry_point"] == "liger"}
    assert recs["vo-squatter"]["status"] == "loaded", recs
    assert kernels_of(dump_all, "vo-squatter") == {("rms_norm", "standard", "liger"),
                                                   ("rms_norm", "standard", "squatter_norm"),
                                                   ("swiglu", "standard", "aaa_zero")}
    if "veomni-liger" not in pkg.real_plugins:
        pytest.skip("plugins/veomni-liger is not in this checkout")
    assert recs["veomni-liger"]["status"] == "loaded", recs
    assert ("rms_norm", "standard", "liger") in kernels_of(dump_all, "veomni-liger")
    contest = ("kernel name 'liger' for rms_norm is registered by 2 distributions: veomni-liger 0.1.0 (entry point "
               "'liger') and vo-squatter 0.1.0 (entry point 'liger'); the bare name selects neither: write "
               "liger@veomni-liger or liger@vo-squatter")
    for dist in ("veomni-liger", "vo-squatter"):
        assert contest in recs[dist]["warnings"], recs[dist]
    # Bare: refused, both named, the qualified names listed.
    out = pkg.py_json(resolve_code({"rms_norm_implementation": "liger"}, {"rms_norm": ["standard"]}))
    assert not out["ok"]
    msg = out["error"]
    assert ("kernel name 'liger' is registered for rms_norm by 2 distributions, veomni-liger 0.1.0 (entry point "
            "'liger') and vo-squatter 0.1.0 (entry point 'liger'), so the bare name selects neither") in msg, msg
    assert ("rms_norm_implementation: liger@veomni-liger or rms_norm_implementation: liger@vo-squatter") in msg, msg
    assert "vo_squatter.kernels" not in out["modules"]
    # Qualified: exactly that one (from the YAML a user writes, through the CLI as well).
    out = pkg.py_json(resolve_code({"rms_norm_implementation": "liger@vo-squatter"}, {"rms_norm": ["standard"]}))
    assert out["ok"], out
    (entry,) = out["plan"]["entries"]
    assert (entry["kernel"], entry["distribution"], entry["requested"], entry["reason"], entry["factory"]) == (
        "liger", "vo-squatter", "liger@vo-squatter", "requested by name", "vo_squatter.kernels:rms_norm")
    cfg = pkg.write("qualified.yaml", """
        model:
          ops_implementation:
            rms_norm_implementation: liger@veomni-liger
        """)
    proc = pkg.cli("resolve", str(cfg), "--device", "cuda:9.0", "--json")
    if proc.returncode != 0:
        # liger-kernel missing (veomni-liger installed --no-deps): refused for that, and for nothing else.
        assert "kernel 'liger@veomni-liger' (veomni-liger 0.1.0 (entry point 'liger')) requires liger-kernel" \
               in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        got = {(e["op"], e["variant"]): e for e in json.loads(proc.stdout)["entries"]}
        assert got[("rms_norm", "standard")]["distribution"] == "veomni-liger"
    # The squatter's other kernels are untouched by the contest.
    out = pkg.py_json(resolve_code({"rms_norm_implementation": "squatter_norm"}, {"rms_norm": ["standard"]}))
    assert out["ok"] and out["plan"]["entries"][0]["distribution"] == "vo-squatter", out
    # Taking the squatter out by distribution gives the name back (its entry point is "liger" too:
    # VEOMNI_OPS_DISABLE=liger would take out both).
    out = pkg.py_json(resolve_code({"rms_norm_implementation": "liger"}, {"rms_norm": ["standard"]}, load=False,
                                   device="cuda:9.0"), env={"VEOMNI_OPS_DISABLE": "vo-squatter"})
    assert "selects neither" not in json.dumps(out), out


def test_auto_keeps_the_core_eager_over_a_third_party_priority_0_kernel(pkg, needs_reference) -> None:
    out = pkg.py_json(resolve_code({}, {"swiglu": ["standard"]}), env={"VEOMNI_OPS_PLUGINS": "vo-squatter"})
    assert out["ok"], out
    (entry,) = out["plan"]["entries"]
    assert (entry["kernel"], entry["distribution"]) == ("eager", "veomni-ops")
    assert entry["reason"] == ("auto: highest priority usable here (priority 0); tie at priority 0 with "
                               "aaa_zero@vo-squatter, broken by origin: the core (veomni-ops) before third-party")


def test_future_plugin_api_is_a_load_failure_naming_both_versions(pkg, dump_all) -> None:
    f = failure(dump_all, "future")
    assert (f["distribution"], f["version"], f["phase"], f["type"]) == (
        "vo-future-api", "0.1.0", "api", "PluginAPIError")
    assert f["message"] == (
        "PluginAPIError: vo-future-api 0.1.0 was built for veomni-ops plugin API >=2.0,<3 (VEOMNI_OPS_PLUGIN_API in "
        "vo_future_api.specs), but this veomni-ops 0.1.0 provides plugin API 1.0: upgrade veomni-ops to a release "
        "whose plugin API is in >=2.0,<3 (pip install -U veomni-ops), or install a release of vo-future-api built "
        "for plugin API 1.0")
    assert kernels_of(dump_all, "vo-future-api") == set()
    rec = record(dump_all, "future")
    assert (rec["status"], rec["phase"]) == ("failed", "api")
    version = pkg.py_json("import json, veomni_ops; print(json.dumps(veomni_ops.PLUGIN_API_VERSION))")
    assert version == "1.0"
    proc = pkg.cli("plugins", env={"VEOMNI_OPS_STRICT": "1", "VEOMNI_OPS_PLUGINS": "vo-future-api"})
    assert proc.returncode == 1 and "upgrade veomni-ops" in proc.stderr, proc.stderr


def test_every_first_party_plugin_declares_the_api_range_and_undeclared_ones_warn(pkg) -> None:
    out = pkg.py_json(NOTES)
    by = {(p["distribution"], p["entry_point"]): p for p in out["plugins"]}
    for dist in pkg.real_plugins:
        for (d, _), p in by.items():
            if d == dist:
                assert not [w for w in p.get("warnings", []) if "plugin API" in w], p
    assert not [w for w in by[("vo-good-backend", "acme")].get("warnings", []) if "plugin API" in w]
    wrongdev = by[("vo-wrong-device", "wrongdev")]
    assert wrongdev["status"] == "loaded"
    (w,) = wrongdev["warnings"]
    assert w.startswith("declares no plugin API range (VEOMNI_OPS_PLUGIN_API in vo_wrong_device.specs); loaded as "
                        "if built for plugin API 1.0"), w
    assert wrongdev["reason"] == w


def test_a_kernel_whose_module_fails_to_import_is_not_usable(pkg) -> None:
    proc = pkg.cli("plugins", "--json", env=NO_DUP)
    assert proc.returncode == 0, proc.stderr
    kernels = {(k["op"], k["name"]): k for k in json.loads(proc.stdout)["kernels"]}
    k = kernels[("swiglu", "broken_kernel")]
    assert (k["usable"], k["why_not"]) == (False, "its kernel failed to import (ImportError: vo_broken_kernel.kernels: "
                                                  "the vendor library this kernel wraps failed to load)"), k
    assert kernels[("swiglu", "acme")]["usable"] is True
    out = pkg.py_json(resolve_code({"swiglu_mlp_implementation": "broken_kernel"}, {"swiglu": ["standard"]}),
                      env=NO_DUP)
    assert not out["ok"]
    assert "its kernel failed to import (ImportError" in out["error"], out["error"]
    usable = out["error"].split("Usable here for swiglu/standard: ")[1].split(".")[0].split(", ")
    assert "acme" in usable and "broken_kernel" not in usable, usable
    # Strict: fatal, in the listing and in resolution.
    strict = {"VEOMNI_OPS_STRICT": "1", "VEOMNI_OPS_PLUGINS": "vo-broken-kernel"}
    proc = pkg.cli("plugins", "--json", env=strict)
    assert proc.returncode == 1 and json.loads(proc.stdout)["kind"] == "PluginLoadError", (proc.returncode, proc.stdout)
    assert "kernel 'broken_kernel' for swiglu/standard (vo-broken-kernel 0.1.0 (entry point 'brokenkernel')) failed " \
           "to import" in proc.stderr, proc.stderr
    assert "VEOMNI_OPS_STRICT=1 makes a kernel that fails to import fatal" in proc.stderr


def test_a_disabled_kernel_is_reported_as_disabled(pkg) -> None:
    env = {"VEOMNI_OPS_DISABLE": "vo-good-backend"}
    out = pkg.py_json(resolve_code({"rms_norm_implementation": "acme"}, {"rms_norm": ["standard"]}), env=env)
    assert not out["ok"]
    assert ("no kernel 'acme' is registered for rms_norm: the plugin that provides it, vo-good-backend 0.1.0 (entry "
            "point 'acme'), is not loaded: disabled by VEOMNI_OPS_DISABLE='vo-good-backend'") in out["error"], out
    assert "pip install" not in out["error"], out["error"]


def test_an_allowlist_naming_an_uninstalled_plugin_warns(pkg) -> None:
    proc = pkg.cli("plugins", env={"VEOMNI_OPS_PLUGINS": "vo-good-backend,vo-not-installed"})
    assert proc.returncode == 0, proc.stderr
    assert ("veomni_ops: VEOMNI_OPS_PLUGINS='vo-good-backend,vo-not-installed' names vo-not-installed, which is not an "
            "installed plugin (entry point or distribution); installed plugins: ") in proc.stderr, proc.stderr
    assert "acme (vo-good-backend)" in proc.stderr and "wrongdev (vo-wrong-device)" in proc.stderr


def test_hints_from_installed_wheels_name_the_index_and_the_npu_stack(pkg) -> None:
    out = pkg.py_json("""
        import json
        from veomni_ops.resolve import install_hint
        print(json.dumps([install_hint("liger"), install_hint("npu")]))
        """)
    # Installed from wheels: no source checkout to point at.
    assert out[0] == 'To get it: pip install "veomni-ops[liger]".', out
    assert out[1].startswith('To get it: pip install "veomni-ops[npu]"; the npu kernels are torch-npu\'s'), out
    assert "Ascend CANN toolkit" in out[1]
    if "veomni-npu" in pkg.real_plugins:
        # check_requires=True: as on an Ascend machine (planned from this one, torch-npu is not checked)
        res = pkg.py_json(resolve_code({"rms_norm_implementation": "npu"}, {"rms_norm": ["standard"]}, device="npu",
                                       load=False, check_requires=True))
        assert not res["ok"]
        assert "requires torch-npu>=2.1, which is not installed" in res["error"], res["error"]
        assert "torch-npu" in res["error"].split("To get it:")[1] and "CANN" in res["error"], res["error"]
