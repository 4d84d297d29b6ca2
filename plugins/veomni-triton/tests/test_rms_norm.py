"""RMSNorm Triton kernels vs a float64 reference (and the core's eager kernels), fwd and bwd."""

from __future__ import annotations

import pytest
import torch
from _helpers import DTYPES, assert_close, core_kernels, graph_capturing_backend
from veomni_triton.kernels import rms_norm as K

EPS = 1e-6
FUNCS = {
    ("standard", False): K.rms_norm_standard,
    ("offset", False): K.rms_norm_offset,
    ("standard", True): K.rms_norm_standard_batch_invariant,
    ("offset", True): K.rms_norm_offset_batch_invariant,
}


def reference(x: torch.Tensor, w: torch.Tensor, eps: float, variant: str) -> torch.Tensor:
    """The contract in float64. The standard variant rounds x̂ to the input dtype before the
    weight multiply (as the contract and transformers do); the rounding passes gradients
    straight through, as autograd of ``.to(dtype)`` does."""
    x64 = x.double()
    xhat = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    if variant == "offset":
        return xhat * (1.0 + w.double())
    rounded = xhat + (xhat.to(x.dtype).double() - xhat).detach()
    return w.double() * rounded


def run_case(x: torch.Tensor, w: torch.Tensor, variant: str, batch_invariant: bool = False):
    """Forward and backward of ours and of the float64 reference on the same inputs."""
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_()
    y = FUNCS[(variant, batch_invariant)](x, w, EPS)
    dy = torch.randn_like(y)
    y.backward(dy)
    x64 = x.detach().clone().requires_grad_()
    w64 = w.detach().clone().requires_grad_()
    y64 = reference(x64, w64, EPS, variant)
    y64.backward(dy.double())
    return (y, x.grad, w.grad), (y64, x64.grad, w64.grad)


def check(ours, ref, what: str, rows: int) -> None:
    y, dx, dw = ours
    y64, dx64, dw64 = ref
    assert_close(y, y64, "rms_norm", f"{what} y")
    assert_close(dx, dx64, "rms_norm", f"{what} dx")
    # dw sums `rows` terms of size ~|dy·x̂|: its absolute error grows like sqrt(rows)
    assert_close(dw, dw64, "rms_norm", f"{what} dw", scale=max(1.0, rows**0.5))


F32, BF16 = torch.float32, torch.bfloat16
# (shape, dtype, variant, batch_invariant): odd widths (33, 100), narrow rows packed several to a
# program (128: ROWS > 1), a wide-ish row (640), 2-D/3-D/4-D inputs; both modes, both variants.
CASES = [
    ((7, 33), F32, "standard", False),
    ((7, 33), BF16, "standard", False),
    ((7, 33), F32, "offset", False),
    ((7, 33), BF16, "offset", False),
    ((2, 3, 100), F32, "standard", False),
    ((2, 3, 100), BF16, "offset", False),
    ((9, 128), BF16, "standard", False),
    ((3, 640), BF16, "standard", False),
    ((3, 640), F32, "offset", False),
    ((1, 2, 5, 48), BF16, "offset", False),
    ((7, 33), BF16, "standard", True),
    ((2, 3, 100), F32, "offset", True),
    ((9, 128), BF16, "offset", True),
]


@pytest.mark.parametrize("shape,dtype,variant,batch_invariant", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_matches_float64_reference(device, dtype, variant, batch_invariant, shape):
    x = torch.randn(shape, device=device, dtype=dtype)
    w = (1.0 + 0.5 * torch.randn(shape[-1], device=device)).to(dtype)
    ours, ref = run_case(x, w, variant, batch_invariant)
    assert ours[0].dtype == dtype and ours[0].shape == x.shape
    assert ours[2].dtype == dtype
    check(ours, ref, f"{variant} {shape}", rows=x.numel() // shape[-1])


@pytest.mark.parametrize("variant", ["standard", "offset"])
def test_one_dimensional_input(device, variant):
    x = torch.randn(100, device=device)
    w = torch.randn(100, device=device)
    ours, ref = run_case(x, w, variant)
    check(ours, ref, "1-D", rows=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_rows_read_in_place(device, dtype):
    """Rows of a wider buffer (row stride != H) are read through the stride, and are right."""
    big = torch.randn(6, 4, 80, device=device, dtype=dtype)
    x = big[..., 10:43]  # [6, 4, 33], last stride 1, rows 80 apart
    assert not x.is_contiguous()
    assert K.as_rows(x, 33).data_ptr() == x.data_ptr()  # a view, no copy
    w = torch.randn(33, device=device, dtype=dtype)
    ours, ref = run_case(x, w, "standard")
    check(ours, ref, "strided rows", rows=24)


def test_transposed_input(device):
    """A last dimension with stride != 1 is copied once (documented), and the result is right."""
    x = torch.randn(33, 12, device=device).t()  # [12, 33], strides (1, 12)
    w = torch.randn(33, device=device)
    for variant in ("standard", "offset"):
        ours, ref = run_case(x, w, variant)
        check(ours, ref, f"transposed {variant}", rows=12)


def test_strided_weight(device):
    x = torch.randn(4, 24, device=device)
    w = torch.randn(48, device=device)[::2]
    for variant in ("standard", "offset"):
        ours, ref = run_case(x, w, variant)
        check(ours, ref, f"strided weight {variant}", rows=4)


def test_noncontiguous_grad_output(device):
    x = torch.randn(5, 40, device=device, requires_grad=True)
    w = torch.randn(40, device=device, requires_grad=True)
    y = K.rms_norm_standard(x, w, EPS)
    dy = torch.randn(40, 5, device=device).t()  # grad with last stride != 1
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    reference(x64, w64, EPS, "standard").backward(dy.double())
    assert_close(x.grad, x64.grad, "rms_norm", "dx")
    assert_close(w.grad, w64.grad, "rms_norm", "dw", scale=3)


def test_fp32_weight_bf16_input(device):
    """A wider weight keeps the output in the input dtype (contract) and dw in the weight dtype."""
    x = torch.randn(8, 64, device=device, dtype=torch.bfloat16)
    w = torch.randn(64, device=device, dtype=torch.float32)
    ours, ref = run_case(x, w, "standard")
    assert ours[0].dtype == torch.bfloat16 and ours[2].dtype == torch.float32
    assert_close(ours[0], ref[0], "rms_norm", "y")
    assert_close(ours[1], ref[1], "rms_norm", "dx")
    assert_close(ours[2].to(torch.bfloat16), ref[2], "rms_norm", "dw", scale=3)


def test_many_rows_several_programs(device):
    """More rows than backward programs: strips of rows per program, partial dw summed."""
    x = torch.randn(301, 24, device=device)
    w = torch.randn(24, device=device)
    _, _, _, programs = K.bwd_config(301, 24, K.num_sms(x.device))
    assert programs > 1
    for variant in ("standard", "offset"):
        ours, ref = run_case(x, w, variant)
        check(ours, ref, f"301 rows {variant}", rows=301)


def test_zero_rows(device):
    x = torch.randn(0, 16, device=device, requires_grad=True)
    w = torch.randn(16, device=device, requires_grad=True)
    y = K.rms_norm_standard(x, w, EPS)
    assert y.shape == (0, 16)
    y.sum().backward()
    assert x.grad.shape == (0, 16)
    assert torch.equal(w.grad, torch.zeros(16, device=device))


def test_backward_is_deterministic(device):
    x = torch.randn(257, 48, device=device, requires_grad=True)
    w = torch.randn(48, device=device, requires_grad=True)
    dy = torch.randn(257, 48, device=device)
    grads = []
    for _ in range(2):
        x.grad = w.grad = None
        K.rms_norm_offset(x, w, EPS).backward(dy)
        grads.append((x.grad.clone(), w.grad.clone()))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.parametrize("variant,n", [("standard", 33), ("offset", 128), ("standard", 1000)])
def test_batch_invariant_rows_bitwise(device, variant, n):
    """A row alone and the same row inside batches of 1..R rows (first and last positions): same bits."""
    fn = FUNCS[(variant, True)]
    rows = 7
    x = torch.randn(rows, n, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, device=device, dtype=torch.bfloat16)
    alone = [fn(x[i : i + 1], w, EPS) for i in range(rows)]
    for m in range(1, rows + 1):
        for start in (0, rows - m):
            batch = fn(x[start : start + m], w, EPS)
            for j in range(m):
                assert torch.equal(batch[j : j + 1], alone[start + j]), f"row {start + j} differs in a batch of {m}"


def test_batch_invariant_config_ignores_batch_size():
    """The batch-invariant launch configuration is a function of H only; `triton` is not."""
    for n in (33, 128, 2560, 8192):
        configs = {K.fwd_config(m, n, True, 132) for m in (1, 2, 7, 100, 8192, 1 << 20)}
        assert len(configs) == 1, configs
    assert K.fwd_config(1, 128, False, 132) != K.fwd_config(1 << 20, 128, False, 132)


@pytest.mark.parametrize("variant", ["standard", "offset"])
def test_matches_core_eager(device, variant):
    core = core_kernels("rms_norm")
    ref_fn = core.rms_norm_standard if variant == "standard" else core.rms_norm_offset
    for dtype in DTYPES:
        x = torch.randn(4, 5, 72, device=device, dtype=dtype, requires_grad=True)
        w = (1 + 0.3 * torch.randn(72, device=device)).to(dtype).requires_grad_()
        dy = torch.randn(4, 5, 72, device=device, dtype=dtype)
        y = FUNCS[(variant, False)](x, w, EPS)
        y.backward(dy)
        xr = x.detach().clone().requires_grad_()
        wr = w.detach().clone().requires_grad_()
        yr = ref_fn(xr, wr, EPS)
        yr.backward(dy)
        assert_close(y, yr, "rms_norm", f"{variant} vs core y")
        assert_close(x.grad, xr.grad, "rms_norm", f"{variant} vs core dx")
        assert_close(w.grad, wr.grad, "rms_norm", f"{variant} vs core dw", scale=5)


def test_compile_fullgraph_no_break(device):
    # one variant is enough: both go through the same custom ops (the variant is an op argument)
    fn = FUNCS[("offset", False)]
    graphs: list = []

    def f(x, w):
        return fn(x, w, EPS).float().square().sum()

    compiled = torch.compile(f, fullgraph=True, backend=graph_capturing_backend(graphs))
    x = torch.randn(3, 4, 40, device=device, requires_grad=True)
    w = torch.randn(40, device=device, requires_grad=True)
    loss = compiled(x, w)
    loss.backward()
    assert len(graphs) == 1
    assert "veomni_triton.rms_norm_fwd" in graphs[0].code
    x2 = x.detach().clone().requires_grad_()
    w2 = w.detach().clone().requires_grad_()
    f(x2, w2).backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)


def test_errors_are_clear(device):
    x = torch.randn(4, 16, device=device)
    with pytest.raises(ValueError, match=r"weight must be \[16\]"):
        K.rms_norm_standard(x, torch.randn(15, device=device), EPS)
    with pytest.raises(ValueError, match=r"weight must be \[16\]"):
        K.rms_norm_standard(x, torch.randn(2, 16, device=device), EPS)
    with pytest.raises(TypeError, match="int64"):
        K.rms_norm_standard(x.long(), torch.randn(16, device=device), EPS)
    with pytest.raises(TypeError, match="float64"):
        K.rms_norm_offset(x.double(), torch.randn(16, device=device).double(), EPS)
    with pytest.raises(ValueError, match="eps"):
        K.rms_norm_standard(x, torch.randn(16, device=device), -1.0)


def test_cpu_without_interpreter_is_refused(monkeypatch):
    from veomni_triton.kernels import _common

    monkeypatch.setattr(_common, "_INTERPRET_AT_IMPORT", False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        K.rms_norm_standard(torch.randn(2, 8), torch.randn(8), EPS)
