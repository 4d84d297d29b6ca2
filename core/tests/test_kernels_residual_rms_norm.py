"""residual_rms_norm eager kernel: a decoder layer's add and Qwen3RMSNorm bitwise, gradcheck, the
conformance cases within the spec's tolerances, errors."""

import pytest
import torch
from veomni_ops.backends import reference
from veomni_ops.kernels.checks import BackendChecks
from veomni_ops.ops.residual_rms_norm.cases import HARNESS
from veomni_ops.ops.residual_rms_norm.kernel import residual_rms_norm
from veomni_ops.testing.case_check import check_case

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bitwise_the_layers_add_and_norm(dtype):
    T = pytest.importorskip("transformers")
    norm = T.models.qwen3.modeling_qwen3.Qwen3RMSNorm(48, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(48) + 0.5)
    x, res = torch.randn(3, 5, 48).to(dtype), torch.randn(3, 5, 48).to(dtype)
    normed, summed = residual_rms_norm(x, res, norm.weight, 1e-6)
    want = res + x
    assert torch.equal(summed, want) and torch.equal(normed, norm(want))


def test_gradcheck_float64():
    args = [torch.randn(4, 6, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    w = torch.rand(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, r, w: residual_rms_norm(x, r, w, 1e-6), (*args, w))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", HARNESS.cases("standard", "small"), ids=lambda c: c.name)
def test_conformance_cases(dtype, case):
    spec = reference.residual_rms_norm()[0]
    res = check_case(residual_rms_norm, spec, HARNESS, "standard", case, dtype, "cpu", seed=1)
    assert res.ok, res.describe()


def test_errors_name_the_problem():
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match=r"x \(4, 32\) and residual \(4, 16\) must have the same shape"):
        residual_rms_norm(x, torch.randn(4, 16), torch.randn(32), 1e-6)
    with pytest.raises(ValueError, match=r"weight must have shape \[H\] = \[32\]"):
        residual_rms_norm(x, x, torch.randn(16), 1e-6)
    with pytest.raises(TypeError, match="different dtypes"):
        residual_rms_norm(x, x.half(), torch.randn(32), 1e-6)
    with pytest.raises(ValueError, match=r"residual_rms_norm \(mine\)"):
        BackendChecks("mine", "my kernels").check_residual_rms_norm_inputs(x, torch.randn(4, 16), torch.randn(32), 1e-6)
