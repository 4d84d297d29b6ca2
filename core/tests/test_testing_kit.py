"""The conformance kit: its cases, its pytest plugin and its base classes (through pytester)."""

import os
import textwrap
from importlib import metadata

import pytest
import torch
from veomni_ops.spec import OPS
from veomni_ops.testing.cases import HARNESSES, Builder, harness

pytest_plugins = ["pytester"]

PLUGIN = "veomni_ops.testing.pytest_plugin"


def plugin_args():
    """``-p`` the kit's plugin unless pytest loads it itself from the installed pytest11 entry point."""
    installed = any(ep.value == PLUGIN for ep in metadata.entry_points(group="pytest11"))
    if installed and not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return []
    return ["-p", PLUGIN]


def write_specs(pytester, module, kernel_module):
    """A backend spec module (not installed) with: a portable swiglu kernel, a cuda-only rms_norm
    kernel, and a wrong swiglu kernel; plus its kernel module."""
    pytester.makepyfile(**{
        kernel_module: """
            import torch.nn.functional as F

            def good(gate, up):
                return F.silu(gate) * up

            def wrong(gate, up):
                return F.silu(gate) * up + 1e-2
        """,
        module: f"""
            from veomni_ops import HardwareRequirement, KernelSpec, hookimpl

            @hookimpl
            def swiglu():
                return [
                    KernelSpec(name="toy", op="swiglu", variant="standard", factory="{kernel_module}:good",
                               dtypes=("float32", "bfloat16")),
                    KernelSpec(name="toywrong", op="swiglu", variant="standard", factory="{kernel_module}:wrong",
                               dtypes=("float32",)),
                ]

            @hookimpl
            def rms_norm():
                return [KernelSpec(name="toy", op="rms_norm", variant="standard",
                                   factory="veomni_ops.kernels.rms_norm:rms_norm_standard",
                                   hardware=HardwareRequirement(("cuda",), min_capability=(8, 0)))]
        """,
    })
    pytester.syspathinsert()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip of a cuda-only kernel on a CPU machine")
def test_plugin_generates_tests_and_skips_missing_hardware(pytester):
    write_specs(pytester, "kit_specs_a", "kit_kernels_a")
    res = pytester.runpytest(*plugin_args(), "--veomni-ops-backend", "toy", "--veomni-ops-plugin", "kit_specs_a",
                             "-rs", "-v")
    n_sw = 2 * len(harness("swiglu").cases("standard", "small"))  # two dtypes x every case
    n_rms = 3 * len(harness("rms_norm").cases("standard", "small"))  # default dtypes x every case
    res.assert_outcomes(passed=n_sw, skipped=n_rms)
    res.stdout.fnmatch_lines([
        "*veomni-ops conformance: backend(s) toy, small shapes, seed 0*",
        "*swiglu.standard.toy?bfloat16-gate-up-halves-6x40? PASSED*",
        "*rms_norm/standard toy: kernel 'toy' (* needs a cuda device, this is cpu*",
    ])


def test_plugin_fails_a_wrong_kernel_and_filters_by_op(pytester):
    write_specs(pytester, "kit_specs_b", "kit_kernels_b")
    res = pytester.runpytest(*plugin_args(), "--veomni-ops-backend", "toywrong", "--veomni-ops-plugin",
                             "kit_specs_b", "--veomni-ops-op", "swiglu", "--veomni-ops-seed", "4",
                             "--veomni-ops-size", "small")
    res.assert_outcomes(failed=len(harness("swiglu").cases("standard", "small")))
    res.stdout.fnmatch_lines([
        "*swiglu/standard kernel 'toywrong' (kit-specs-b local) on *, small shapes, seed 4:*",
        "*2d-3x17 [[]float32[]]: fail, worst error * in out*outside tolerance (atol=1e-05, rtol=0.0001 for float32)*",
    ])


def test_plugin_counts_its_tests_in_the_collected_line(pytester):
    """pytest's "collected N items" (and --collect-only's summary) counts the kit's tests beside a
    test file's: they said "collected 1 item" (0 in an empty folder) before "9 passed"."""
    pytester.makepyfile("def test_x():\n    assert True\n")
    n = len(harness("swiglu").cases("standard", "small"))
    args = (*plugin_args(), "--veomni-ops-backend", "eager", "--veomni-ops-op", "swiglu",
            "--veomni-ops-dtype", "float32", "--veomni-ops-size", "small")
    res = pytester.runpytest(*args)
    res.assert_outcomes(passed=n + 1)
    res.stdout.fnmatch_lines([f"collected {n + 1} items"])
    res = pytester.runpytest(*args, "--collect-only", "-q")
    # the node ids the module's docstring gives (they began "::veomni-ops::")
    res.stdout.fnmatch_lines(["veomni-ops::swiglu.standard.eager[[]float32-2d-3x17[]]", f"{n + 1} tests collected*"])


def test_plugin_unknown_backend_fails_clearly(pytester):
    res = pytester.runpytest(*plugin_args(), "--veomni-ops-backend", "nosuchbackend")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*--veomni-ops-backend nosuchbackend: no registered kernel matches*"])


def test_plugin_is_inert_without_the_option(pytester):
    pytester.makepyfile("def test_x():\n    assert True\n")
    pytester.runpytest(*plugin_args()).assert_outcomes(passed=1)


def test_base_class_for_backend_authors(pytester):
    write_specs(pytester, "kit_specs_c", "kit_kernels_c")
    pytester.makepyfile(test_mine=textwrap.dedent("""
        from veomni_ops.testing import SwigluConformance

        class TestToy(SwigluConformance):
            kernel_name = "toy"
            plugins = ("kit_specs_c",)

        class TestWrong(SwigluConformance):
            kernel_name = "toywrong"
            plugins = ("kit_specs_c",)

        class TestMissing(SwigluConformance):
            kernel_name = "not_registered"
            plugins = ("kit_specs_c",)
    """))
    res = pytester.runpytest(*plugin_args(), "-v", "--veomni-ops-size", "small")
    n = len(harness("swiglu").cases("standard", "small"))
    # TestToy: registered + 2 dtypes x n; TestWrong: registered + n failures; TestMissing: 2 failures;
    # test_compiles skips in all three (nothing declares supports_compile, or nothing is registered)
    res.assert_outcomes(passed=1 + 2 * n + 1, failed=n + 2, skipped=3)
    res.stdout.fnmatch_lines([
        "*TestToy::test_conformance?standard-float32-2d-3x17? PASSED*",
        "*TestWrong::test_conformance?standard-float32-2d-3x17? FAILED*",
        "*TestMissing::test_registered FAILED*",
    ])
    assert "no kernel 'not_registered' is registered for swiglu" in res.stdout.str()


# --- the cases themselves -------------------------------------------------------------------
def test_every_op_has_cases_for_each_variant_and_size():
    assert set(HARNESSES) == set(OPS)
    for op, variants in OPS.items():
        h = harness(op)
        for v in variants:
            for size in ("small", "full"):
                cases = h.cases(v, size)
                assert len(cases) >= 3, (op, v, size)
                assert len({c.name for c in cases}) == len(cases)
                assert all(c.diff for c in cases)


def test_edge_cases_are_present():
    def names(op, variant, size="small"):
        return " ".join(c.name for c in harness(op).cases(variant, size))

    assert all(x in names("moe_experts", "standard") for x in ("idle-experts", "one-expert", "duplicate-routes"))
    assert all(x in names("cross_entropy", "logits") for x in ("all-ignored", "ignore-index-3", "strided"))
    assert "all-ignored" in names("cross_entropy", "fused_linear") and "bias" in names("cross_entropy", "fused_linear")
    for variant in ("logits", "fused_linear"):  # the loss as the model divides it, with nothing counted
        for size in ("small", "full"):
            assert all(f"all-ignored-{x}" in names("cross_entropy", variant, size) for x in ("mean", "num-items-0"))
    assert "padding" in names("attention", "standard") and "bshd-view" in names("attention", "standard")
    assert "padding-mask" in names("load_balancing_loss", "standard")
    assert "gate-up-halves" in names("swiglu", "standard") and "strided-rows" in names("rms_norm", "offset")


@pytest.mark.parametrize("op", list(OPS))
def test_small_inputs_build_as_described(op):
    h = harness(op)
    for variant in OPS[op]:
        for case in h.cases(variant, "small"):
            a = case.build(Builder(5, torch.bfloat16, "cpu"))
            b = case.build(Builder(5, torch.bfloat16, "cpu"))
            c = case.build(Builder(6, torch.bfloat16, "cpu"))
            for name in case.diff:
                if a[name] is None:
                    continue
                ta = a[name] if isinstance(a[name], list) else [a[name]]
                tb = b[name] if isinstance(b[name], list) else [b[name]]
                tc = c[name] if isinstance(c[name], list) else [c[name]]
                for x, y, z in zip(ta, tb, tc):
                    # the case dtype, except a mixed-precision case's float32 norm weight
                    mixed = case.name.startswith("fp32-weight") and name == "weight"
                    assert x.dtype == (torch.float32 if mixed else torch.bfloat16), (op, case.name, name)
                    assert torch.equal(x, y), (op, case.name, name)  # same seed, same values
                    # fresh values per seed (an empty tensor, a zero-rows case's, has none)
                    assert x.numel() == 0 or not torch.equal(x, z), (op, case.name, name)
            # what the name promises about layout holds
            if any(k in case.name for k in ("strided", "bshd-view", "gate-up-halves")):
                assert any(not t.is_contiguous() for t in a.values() if isinstance(t, torch.Tensor)), case.name


def test_rms_norm_has_a_mixed_dtype_case_in_each_size():
    # a float32 weight with 16-bit activations; in float32/float64 runs the weight has the case dtype
    for variant in OPS["rms_norm"]:
        for size in ("small", "full"):
            mixed = [c for c in harness("rms_norm").cases(variant, size) if c.name.startswith("fp32-weight")]
            assert len(mixed) == 1, (variant, size)
    case = next(c for c in harness("rms_norm").cases("standard", "small") if c.name.startswith("fp32-weight"))
    for dtype, weight in ((torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                          (torch.float32, torch.float32), (torch.float64, torch.float64)):
        inp = case.build(Builder(0, dtype, "cpu"))
        assert inp["hidden_states"].dtype == dtype and inp["weight"].dtype == weight


def test_rotary_partial_rotates_fewer_channels():
    for case in harness("rotary").cases("partial", "small"):
        inp = case.build(Builder(0, torch.float32, "cpu"))
        assert inp["cos"].shape[-1] < inp["q"].shape[-1]
    for case in harness("rotary").cases("full", "small"):
        inp = case.build(Builder(0, torch.float32, "cpu"))
        assert inp["cos"].shape[-1] == inp["q"].shape[-1]


def test_moe_routing_edge_cases_route_as_named():
    cases = {c.name: c for c in harness("moe_experts").cases("standard", "small")}
    idle = next(v for k, v in cases.items() if k.startswith("idle-experts")).build(Builder(0, torch.float32, "cpu"))
    e = idle["gate_up_proj"].shape[0]
    assert idle["top_k_index"].max() < e // 2  # the upper half of the experts gets nothing
    one = next(v for k, v in cases.items() if k.startswith("one-expert")).build(Builder(0, torch.float32, "cpu"))
    assert one["top_k_index"].unique().numel() == 1
    dup = next(v for k, v in cases.items() if k.startswith("duplicate")).build(Builder(0, torch.float32, "cpu"))
    assert (dup["top_k_index"][:, 0] == dup["top_k_index"][:, 1]).any()
