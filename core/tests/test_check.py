"""`veomni-ops check` and the comparison underneath it: passes what is right, fails what is not."""

import argparse
import json
import math
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from conftest import make_plugin
from veomni_ops import HardwareRequirement, KernelSpec, Tolerance, build_registry
from veomni_ops.backends import reference
from veomni_ops.testing import check
from veomni_ops.testing.cases import harness
from veomni_ops.testing.runner import compare, run_checks, unit_scale


def reference_registry(*extra):
    """The core's reference backend as an in-process plugin (no entry points needed), plus extras."""
    return build_registry([("veomni-ops", reference), *extra], include_entry_points=False, env={})


def args(**kw):
    base = dict(backend=None, op=None, device="cpu", size=None, dtype=None, seed=0, plugin=[], json=False,
                verbose=False, registry=None, case=None, compile=False, deterministic=False)
    base.update(kw)
    return argparse.Namespace(**base)


# --- wrong kernels, each wrong in one way -------------------------------------------------
def _offby(gate, up):
    return F.silu(gate) * up + 1e-2  # forward off by 1e-2 everywhere


class _BadGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, dout):
        gate, up = ctx.saved_tensors
        s = torch.sigmoid(gate)
        return dout * up * s, dout * gate * s  # dgate forgets the (1 + g(1 - s)) factor


def _badgrad(gate, up):
    return _BadGrad.apply(gate, up)


def _upcast(gate, up):
    return F.silu(gate.float()) * up.float()  # right values, wrong dtype for half inputs


def _raises(gate, up):
    raise RuntimeError("kernel exploded")


class _Writer(torch.autograd.Function):
    """Right values and gradients, but it scribbles over its input ``gate`` (as some kernels
    reuse an input's memory)."""

    @staticmethod
    def forward(ctx, gate, up):
        g, u = gate.clone(), up.clone()
        ctx.save_for_backward(g, u)
        out = F.silu(g) * u
        gate.zero_()
        return out

    @staticmethod
    def backward(ctx, dout):
        g, u = ctx.saved_tensors
        s = torch.sigmoid(g)
        return dout * u * s * (1 + g * (1 - s)), dout * g * s


def _writer(gate, up):
    return _Writer.apply(gate, up)


def _sw(name, fn, **kw):
    # factory as a zero-argument callable returning the kernel (the KernelSpec's other form)
    return KernelSpec(name=name, op="swiglu", variant="standard", factory=lambda: fn, **kw)


WRONG = make_plugin("wrong", swiglu=[
    _sw("offby", _offby),
    _sw("badgrad", _badgrad, dtypes=("float32",)),
    _sw("upcast", _upcast, dtypes=("bfloat16",)),
    _sw("raises", _raises, dtypes=("float32",)),
    _sw("gpuonly", _offby, hardware=HardwareRequirement(("cuda",), min_capability=(9, 0))),
    _sw("writer", _writer, dtypes=("float32",)),
])


def test_reference_and_portable_kernels_pass_on_cpu(capsys):
    reg = reference_registry()
    rc = check.run(args(registry=reg, json=True))
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, [(k["op"], k["kernel"], [c for c in k["cases"] if c["status"] != "pass"]) for k in out["kernels"]]
    kernels = {(k["op"], k["variant"], k["kernel"]): k for k in out["kernels"]}
    # every op and variant of the eager reference, and the portable kernels, were checked and passed
    for key in [("rms_norm", "standard", "eager"), ("rms_norm", "offset", "eager"), ("rotary", "partial", "eager"),
                ("swiglu", "standard", "eager"), ("cross_entropy", "logits", "eager"),
                ("cross_entropy", "fused_linear", "chunked"), ("moe_experts", "standard", "grouped_mm"),
                ("load_balancing_loss", "standard", "eager"), ("attention", "standard", "sdpa")]:
        k = kernels[key]
        assert k["status"] == "pass" and k["cases"], key
        assert all(c["status"] in ("pass", "unsupported") for c in k["cases"])
    # float16/bfloat16 and float64 all ran; gradients were compared
    fl = kernels[("cross_entropy", "fused_linear", "chunked")]
    assert {c["dtype"] for c in fl["cases"]} == {"float32", "bfloat16", "float16", "float64"}
    assert any("grad weight" in c["tensors"] for c in fl["cases"])
    # eager/sdpa take the 4-D masks and refuse the flash 2-D form (optional): reported, not failed
    sdpa = [c for c in kernels[("attention", "standard", "sdpa")]["cases"] if c["case"].startswith("padding-2d")]
    assert sdpa and all(c["status"] == "unsupported" for c in sdpa)


def test_wrong_forward_fails_with_nonzero_exit(capsys):
    reg = reference_registry(("wrong", WRONG))
    rc = check.run(args(registry=reg, backend="offby", dtype=["float32"]))
    cap = capsys.readouterr()
    assert rc == 1
    lines = cap.out.splitlines()
    (at,) = [i for i, ln in enumerate(lines) if ln.startswith("swiglu/standard  offby ")]
    assert lines[at + 1].split()[:2] == ["float32", "FAIL"], cap.out  # the kernel's line, then its dtype's
    assert "outside tolerance (atol=1e-05, rtol=0.0001 for float32) in: out" in " ".join(cap.out.split())
    assert "1 kernel(s) FAILED: swiglu/standard offby" in cap.err and "--seed 0" in cap.err


@pytest.mark.parametrize("verbose", [False, True])
def test_text_report_fits_100_columns_and_loses_nothing(capsys, verbose):
    """Passes, failures, a kernel raising, a skip with its long reason, notes and ``-v``'s every
    case: no line over 100 columns (the table was about 200 wide); wrapped, nothing is cut."""
    rc = check.run(args(registry=reference_registry(("wrong", WRONG)), op="swiglu", compile=True, verbose=verbose))
    out = capsys.readouterr().out
    assert rc == 1
    assert max(len(ln) for ln in out.splitlines()) <= 100, "\n".join(ln for ln in out.splitlines() if len(ln) > 100)
    flat = " ".join(out.split())
    assert "skip: kernel 'gpuonly' (wrong local (entry point 'wrong')) needs a cuda device" in flat
    assert "swiglu/standard raises 2d-3x17 [float32]: error" in flat and "kernel exploded" in flat
    assert "swiglu/standard writer [float32] note: writes into its input(s) gate (in place)" in flat
    assert "swiglu/standard eager torch.compile(fullgraph=True): pass" in flat
    shown = {case for case in harness("swiglu").cases("standard", "small") if f"eager {case.name} [float32]: pass" in flat}
    assert len(shown) == (len(harness("swiglu").cases("standard", "small")) if verbose else 0)


def test_case_option_runs_only_the_named_cases(capsys):
    reg = reference_registry()
    rc = check.run(args(registry=reg, op="rms_norm", case=["rows-3x17", "one-row-1x256"], json=True))
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    for k in out["kernels"]:
        assert k["status"] == "pass"
        assert {c["case"] for c in k["cases"]} == {"rows-3x17", "one-row-1x256"}


def test_compile_option_verifies_each_checked_kernel(capsys):
    reg = reference_registry(("wrong", WRONG))
    rc = check.run(args(registry=reg, op="swiglu", backend="eager", dtype=["float32"], compile=True, json=True))
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    (k,) = out["kernels"]
    assert k["compile"] == "pass" or k["compile"].startswith("declares supports_compile=False")
    # without --compile the report has no compile verdict
    check.run(args(registry=reg, op="swiglu", backend="eager", dtype=["float32"], json=True))
    assert "compile" not in json.loads(capsys.readouterr().out)["kernels"][0]


def test_compile_option_fails_a_kernel_whose_claim_is_false(capsys):
    def breaks(gate, up):
        torch._dynamo.graph_break()
        return F.silu(gate) * up

    liar = make_plugin("liar", swiglu=[_sw("liar", breaks, dtypes=("float32",), supports_compile=True)])
    rc = check.run(args(registry=reference_registry(("liar", liar)), backend="liar", compile=True))
    cap = capsys.readouterr()
    assert rc == 1
    assert "torch.compile(fullgraph=True): FAIL:" in cap.out and "supports_compile=True but" in cap.out


def test_deterministic_option_fails_a_kernel_that_differs_run_to_run(capsys):
    calls = []

    def noisy(gate, up):
        calls.append(1)  # a different last bit on every call
        return F.silu(gate) * up * (1 + len(calls) * torch.finfo(gate.dtype).eps)

    reg = reference_registry(("noisy", make_plugin("noisy", swiglu=[_sw("noisy", noisy, dtypes=("float32",))])))
    rc = check.run(args(registry=reg, backend="noisy", deterministic=True, json=True))
    (k,) = json.loads(capsys.readouterr().out)["kernels"]
    assert rc == 1 and k["status"] == "fail"
    assert k["deterministic"].startswith("FAIL: float32 ") and "differs between two runs" in k["deterministic"]
    rc = check.run(args(registry=reg, op="swiglu", backend="eager", dtype=["float32"], deterministic=True,
                        json=True))
    (k,) = json.loads(capsys.readouterr().out)["kernels"]
    assert rc == 0 and k["deterministic"] == "pass"


def test_wrong_backward_is_caught_and_attributed():
    rep = run_checks(reference_registry(("wrong", WRONG)), backend="badgrad", device="cpu", seed=3)
    (k,) = rep.kernels
    assert k.status == "fail"
    bad = [r for r in k.results if r.status == "fail"]
    assert bad and all(r.worst_in == "grad gate" for r in bad)
    # the forward and the other gradient are right
    for r in k.results:
        by = {c.name: c.ratio for c in r.comparisons}
        assert by["out"] <= 1 and by["grad up"] <= 1


def test_contract_dtype_and_exceptions_fail():
    rep = run_checks(reference_registry(("wrong", WRONG)), op="swiglu", device="cpu")
    status = {k.kernel: k for k in rep.kernels}
    assert status["eager"].status == "pass"
    up = status["upcast"]
    assert up.status == "fail"
    assert "out has dtype float32, the contract says bfloat16" in up.results[0].message
    boom = status["raises"]
    assert boom.status == "fail" and boom.results[0].status == "error"
    assert "kernel raised RuntimeError: kernel exploded" in boom.results[0].message
    gpu = status["gpuonly"]
    assert gpu.status == "skip" and "needs a cuda device, this is cpu" in gpu.reason
    assert not rep.ok


def test_unusable_only_is_skipped_not_failed(capsys):
    rc = check.run(args(registry=reference_registry(("wrong", WRONG)), backend="gpuonly"))
    cap = capsys.readouterr()
    assert rc == 0
    assert "skip: kernel 'gpuonly' (wrong local (entry point 'wrong')) needs a cuda device, this is cpu" in cap.out
    assert "nothing was checked" in cap.err


def test_unknown_backend_is_an_error(capsys):
    rc = check.run(args(registry=reference_registry(), backend="nosuch"))
    assert rc == 1
    assert "no registered kernel matches backend 'nosuch'" in capsys.readouterr().err


def test_cli_with_plugin_module(tmp_path, monkeypatch, capsys):
    """`veomni-ops check --plugin MODULE` through the real CLI entry: loads a spec module that is
    not installed, and fails its wrong kernel."""
    (tmp_path / "offby_specs_cli.py").write_text(textwrap.dedent("""
        from veomni_ops import KernelSpec, hookimpl

        @hookimpl
        def swiglu():
            return [KernelSpec(name="offby_cli", op="swiglu", variant="standard",
                               factory="offby_kernels_cli:silu_mul", dtypes=("float32",))]
    """))
    (tmp_path / "offby_kernels_cli.py").write_text(textwrap.dedent("""
        import torch.nn.functional as F

        def silu_mul(gate, up):
            return F.silu(gate) * up * 1.01
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    from veomni_ops.cli import main

    rc = main(["check", "--plugin", "offby_specs_cli", "--backend", "offby_cli", "--json", "--seed", "5",
               "--device", "cpu"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    (k,) = out["kernels"]
    assert (k["kernel"], k["status"], k["distribution"]) == ("offby_cli", "fail", "offby-specs-cli")
    assert out["seed"] == 5 and out["size"] == "small"
    assert float(k["worst"]) > 1


def test_check_modules_import_without_torch():
    code = ("import sys; import veomni_ops.testing.check, veomni_ops.bench, veomni_ops.testing.pytest_plugin, "
            "veomni_ops.cli; veomni_ops.cli.build_parser(); "
            "assert 'torch' not in sys.modules, 'torch imported at module level'")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- the comparison -------------------------------------------------------------------------
def test_compare_ratio_and_unit_scale():
    tol = Tolerance(1e-3, 1e-2)
    ref = torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64)
    # RMS = sqrt((1 + 4 + .25) / 4) = 1.146 -> unit scale 1
    assert unit_scale(ref) == 1.0
    got = ref + torch.tensor([0.0, 0.0, 0.0, 2e-3], dtype=torch.float64)
    c = compare("x", got, ref, tol)
    assert math.isclose(c.ratio, 2.0) and math.isclose(c.max_abs, 2e-3)  # 2e-3 / (1e-3 * 1 + 0)
    # the same tensors scaled by 1024 compare identically (scale-free comparison)
    c2 = compare("x", got * 1024, ref * 1024, tol)
    assert c2.scale == 1024 and math.isclose(c2.ratio, 2.0)
    # scalars are compared as they are
    assert unit_scale(torch.tensor(500.0, dtype=torch.float64)) == 1.0
    # a reference that cancels to rounding noise is treated as zero, not blown up
    assert unit_scale(torch.full((8,), 1e-17, dtype=torch.float64)) == 1.0


def test_compare_nonfinite_and_mask():
    tol = Tolerance(1e-3, 1e-3)
    ref = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert compare("x", torch.tensor([1.0, float("nan"), 3.0]), ref, tol).ratio == math.inf
    assert compare("x", torch.tensor([1.0, float("inf"), 3.0]), ref, tol).ratio == math.inf
    # masked-out elements do not count
    mask = torch.tensor([True, False, True])
    assert compare("x", torch.tensor([1.0, 99.0, 3.0]), ref, tol, mask).ratio == 0.0


@pytest.mark.parametrize("op", ["swiglu", "rms_norm"])
def test_seed_reproduces(op):
    reg = reference_registry()
    a = run_checks(reg, op=op, device="cpu", dtypes=["bfloat16"], seed=11)
    b = run_checks(reg, op=op, device="cpu", dtypes=["bfloat16"], seed=11)
    c = run_checks(reg, op=op, device="cpu", dtypes=["bfloat16"], seed=12)
    worst = [[r.worst for r in k.results] for k in a.kernels]
    assert worst == [[r.worst for r in k.results] for k in b.kernels]
    assert worst != [[r.worst for r in k.results] for k in c.kernels]


def test_writing_into_inputs_is_reported_not_failed(capsys):
    rc = check.run(args(registry=reference_registry(("wrong", WRONG)), backend="writer"))
    out = capsys.readouterr().out
    assert rc == 0  # values and gradients are right: the reference saw a copy
    assert "swiglu/standard writer [float32] note: writes into its input(s) gate (in place)" in out


# --- low precision: the output dtype's spacing, and eager in the same dtype as the baseline ---
def test_compare_allows_rounding_to_the_output_dtype():
    tol = Tolerance(1e-4, 1e-3)
    # values far below float16's smallest normal (6.1e-5): rounding alone moves them by up to
    # 3e-8, far more than atol * unit scale; one float16 spacing (2**-24) is allowed for that
    ref = torch.linspace(1e-7, 5e-7, 64, dtype=torch.float64)
    c = compare("x", ref.to(torch.float16), ref, tol)
    assert c.ratio <= 1.0
    assert compare("x", ref.to(torch.float16) * 1.5, ref, tol).ratio > 1.0  # a real error still fails
    # float32 spacing at these values is negligible: the same data in float32 is held to the tolerance
    assert compare("x", (ref * 1.01).to(torch.float32), ref, tol).ratio > 1.0


def _eager_like(gate, up):
    return F.silu(gate) * up  # what eager computes, in the inputs' dtype


class _FourTimesEagerError(torch.autograd.Function):
    """Forward with four times eager's rounding error (eager + 3 * (eager - exact))."""

    @staticmethod
    def forward(ctx, gate, up):
        e = (F.silu(gate.double()) * up.double())
        lowp = (F.silu(gate) * up).double()
        ctx.save_for_backward(gate, up)
        return (lowp + 3 * (lowp - e)).to(gate.dtype)

    @staticmethod
    def backward(ctx, dout):
        gate, up = ctx.saved_tensors
        with torch.enable_grad():
            g, u = gate.detach().requires_grad_(), up.detach().requires_grad_()
            return torch.autograd.grad(F.silu(g) * u, (g, u), dout)


def _four_times(gate, up):
    return _FourTimesEagerError.apply(gate, up)


TIGHT = {"bfloat16": Tolerance(1e-6, 1e-6)}  # far tighter than bfloat16 can meet
LOWP = make_plugin("lowp", swiglu=[
    _sw("like_eager", _eager_like, dtypes=("bfloat16",), tolerances=TIGHT),
    _sw("four_times", _four_times, dtypes=("bfloat16",), tolerances=TIGHT),
])


@pytest.fixture
def no_ulp(monkeypatch):
    # Without the output dtype's spacing, bfloat16 rounding alone is far outside TIGHT: the
    # tolerance fails every kernel, eager included, so the baseline decides.
    from veomni_ops.testing import compare as comparison

    monkeypatch.setattr(comparison, "ulp", lambda b, dtype: torch.zeros_like(b))


def test_error_no_worse_than_eager_in_the_dtype_passes_with_a_note(capsys, no_ulp):
    rc = check.run(args(registry=reference_registry(("lowp", LOWP)), backend="like_eager", op="swiglu"))
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "within 2x the error of eager in bfloat16" in " ".join(out.split())  # a long note is wrapped


def test_error_well_beyond_eager_in_the_dtype_fails_and_names_both(capsys, no_ulp):
    rc = check.run(args(registry=reference_registry(("lowp", LOWP)), backend="four_times", op="swiglu"))
    out = capsys.readouterr().out
    assert rc == 1
    assert "eager in bfloat16:" in out and "outside tolerance (atol=1e-06, rtol=1e-06 for bfloat16)" in out


def test_the_eager_kernel_itself_is_held_to_its_tolerance(no_ulp):
    # the baseline would be the kernel itself: it is not consulted
    tight = make_plugin("tight", swiglu=[
        KernelSpec(name="tight_eager", op="swiglu", variant="standard", dtypes=("bfloat16",), tolerances=TIGHT,
                   factory="veomni_ops.kernels.swiglu:silu_mul")])
    rep = run_checks(reference_registry(("tight", tight)), backend="tight_eager", device="cpu", seed=3)
    [k] = rep.kernels
    assert k.status == "fail" and all(r.baseline is None for r in k.results)


def test_float32_gets_no_allowance_from_eager_in_the_same_dtype(capsys, no_ulp):
    # Identical to eager in float32, so exactly "within 2x of eager's own error": the allowance
    # is for 16-bit dtypes only, a float32 result must meet its spec's tolerance.
    tight32 = make_plugin("tight32", swiglu=[
        _sw("like_eager32", _eager_like, dtypes=("float32",), tolerances={"float32": Tolerance(1e-9, 1e-9)})])
    rep = run_checks(reference_registry(("tight32", tight32)), backend="like_eager32", device="cpu", seed=3)
    [k] = rep.kernels
    assert k.status == "fail"
    assert all(r.baseline is None and "eager in" not in r.message for r in k.results if r.status == "fail")
    assert any("outside tolerance (atol=1e-09, rtol=1e-09 for float32)" in r.message for r in k.results)


# --- mixed dtypes: a float32 norm weight with 16-bit activations ---------------------------
def _rms_promoting(hidden_states, weight, eps):
    # Right values, but ``weight * x̂`` promotes: a float32 weight turns a bfloat16 input's
    # output into float32, where the contract keeps the input dtype.
    x = hidden_states.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(hidden_states.dtype)


def test_rms_norm_with_a_float32_weight_must_keep_the_input_dtype():
    promoting = make_plugin("promoting", rms_norm=[
        KernelSpec(name="promoting", op="rms_norm", variant="standard", factory=lambda: _rms_promoting,
                   dtypes=("float32", "bfloat16"))])
    rep = run_checks(reference_registry(("promoting", promoting)), backend="promoting", device="cpu")
    [k] = rep.kernels
    assert k.status == "fail"
    bad = [r for r in k.results if r.status == "fail"]
    # only the mixed case in bfloat16 fails, and for the dtype; everything else is right
    assert [(r.case, r.dtype) for r in bad] == [("fp32-weight-6x40", "bfloat16")]
    assert "out has dtype float32, the contract says bfloat16" in bad[0].message
    # the core's eager kernels keep the input dtype (and pass the mixed case, in both variants)
    eager = run_checks(reference_registry(), backend="eager", op="rms_norm", device="cpu")
    mixed = [r for k in eager.kernels for r in k.results if r.case.startswith("fp32-weight")]
    assert len(mixed) == 2 * 4 and all(r.status == "pass" for r in mixed)
