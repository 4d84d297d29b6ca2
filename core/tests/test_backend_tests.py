"""veomni_ops.testing.backend_tests: what every backend's own tests/conftest.py builds on."""

from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch
from veomni_ops.backends import reference
from veomni_ops.spec import Tolerance
from veomni_ops.testing import backend_tests as kit
from veomni_ops.testing.backend_tests import seeded  # noqa: F401  (an autouse fixture, as a conftest takes it)

TOL = Tolerance(atol=1e-3, rtol=0.0)


def test_assert_close_holds_to_the_tolerance_at_the_expected_magnitude():
    e = torch.tensor([0.5, 100.0])
    kit.assert_close(e + torch.tensor([0.0, 0.09]), e, TOL, "x")  # atol scaled by max|e| = 100
    with pytest.raises(AssertionError, match=r"x \(torch.float32\): 1/2 elements out of tolerance.*flat index 1"):
        kit.assert_close(e + torch.tensor([0.0, 0.2]), e, TOL, "x")
    with pytest.raises(AssertionError, match="out of tolerance"):  # a fixed scale: no widening
        kit.assert_close(e + torch.tensor([0.0, 0.09]), e, TOL, "x", scale=1.0)
    with pytest.raises(AssertionError, match="shape"):
        kit.assert_close(e[:1], e, TOL, "x")


def test_assert_close_refuses_non_finite_values_where_the_reference_is_finite():
    e = torch.tensor([1.0, float("inf")])
    kit.assert_close(torch.tensor([1.0, float("inf")]), e, TOL, "y")
    with pytest.raises(AssertionError, match=r"y \(torch.bfloat16\): non-finite"):
        kit.assert_close(torch.tensor([float("nan"), float("inf")]), e, TOL, "y", dtype=torch.bfloat16)


def test_spec_for_finds_by_variant_and_name_and_says_what_is_missing():
    assert kit.spec_for(reference, "rms_norm", "offset").variant == "offset"
    assert kit.spec_for(reference, "rms_norm", name="eager").name == "eager"
    with pytest.raises(LookupError, match="declares no rms_norm kernel of variant 'nope' named 'eager'"):
        kit.spec_for(reference, "rms_norm", "nope", name="eager")
    assert {s.op for s in kit.all_specs(reference)} >= {"rms_norm", "swiglu", "rotary"}


def test_signature_reads_name_kind_and_default():
    def f(a, b=2, *, c=None): ...

    P, K = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
    assert kit.signature(f) == [("a", P, None), ("b", P, 2), ("c", K, None)]


def test_use_standins_goes_first_and_refuses_a_real_module(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    standins, extra = tmp_path / "standins", tmp_path / "tests"
    (standins / "vendor_x").mkdir(parents=True)
    (standins / "vendor_x" / "__init__.py").write_text("")
    kit.use_standins(standins, "vendor_x", also=(extra,), fix="run it on a GPU")
    assert sys.path[:2] == [str(standins), str(extra)]
    # one imported from below the stand-ins folder, or one that says it is a stand-in: fine
    monkeypatch.setitem(sys.modules, "vendor_x", types.SimpleNamespace(__file__=str(standins / "vendor_x/__init__.py")))
    monkeypatch.setitem(sys.modules, "vendor_y", types.SimpleNamespace(__file__="/site/vendor_y.py", IS_STAND_IN=True))
    kit.use_standins(standins, "vendor_x", "vendor_y", fix="run it on a GPU")
    monkeypatch.setitem(sys.modules, "vendor_y", types.SimpleNamespace(__file__="/site/vendor_y.py"))
    with pytest.raises(pytest.UsageError, match=r"a real vendor_y is already imported.*run it on a GPU"):
        kit.use_standins(standins, "vendor_y", fix="run it on a GPU")


def test_kernel_device_is_the_cpu_under_the_interpreter():
    assert kit.kernel_device(True) == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(pytest.skip.Exception, match="no CUDA device"):
            kit.kernel_device(False)


def test_seeded_starts_every_test_from_seed_zero():
    got = torch.rand(3)  # the autouse fixture imported above ran before this test
    torch.manual_seed(0)
    assert torch.equal(got, torch.rand(3))
