"""The adapters against the stand-in Quack: argument translation, layout fixes, input checks,
and numerics (forward and backward) against float64 references and the core's eager kernels."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import torch.nn.functional as F
import veomni_quack.kernels._common as common
from _helpers import assert_close, core_kernels
from veomni_quack.kernels import cross_entropy as ce
from veomni_quack.kernels import linear_cross_entropy as lce
from veomni_quack.kernels import rms_norm as rms

# importlib, not `import quack.rmsnorm as m`: quack/__init__ rebinds the names rmsnorm and
# cross_entropy to the functions (as the real package does).
fake_rms = importlib.import_module("quack.rmsnorm")
fake_ce = importlib.import_module("quack.cross_entropy")
fake_lce = importlib.import_module("quack.linear_cross_entropy")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _clear_calls():
    for m in (fake_rms, fake_ce, fake_lce):
        m.CALLS.clear()


# --------------------------------------------------------------------------- rms_norm
def rms_ref64(x, w, eps, variant):
    x, w = x.double(), w.double()
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return xhat * w if variant == "standard" else xhat * (1.0 + w)


def _grads(fn, *inputs, cot):
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    out.backward(cot)
    return out, [t.grad for t in leaves]


@pytest.mark.parametrize("variant", ["standard", "offset"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 5, 64), (7, 38), (3, 1, 2, 40)], ids=str)
def test_rms_norm_matches_float64_and_core(variant, dtype, shape):
    kernel = rms.rms_norm_standard if variant == "standard" else rms.rms_norm_offset
    x = torch.randn(shape, dtype=dtype) * 3
    w = (torch.randn(shape[-1]) * 0.5 + (1.0 if variant == "standard" else 0.0)).to(dtype)
    cot = torch.randn(shape, dtype=dtype)
    eps = 1e-6
    out, (gx, gw) = _grads(lambda a, b: kernel(a, b, eps), x, w, cot=cot)
    assert out.dtype == dtype and out.shape == x.shape
    ref, (rx, rw) = _grads(lambda a, b: rms_ref64(a, b, eps, variant), x.double(), w.double(), cot=cot.double())
    for got, exp, what in ((out, ref, "out"), (gx, rx, "dx"), (gw, rw, "dw")):
        assert_close(got, exp, "rms_norm", variant, what, dtype)
    core = core_kernels("rms_norm")
    core_fn = core.rms_norm_standard if variant == "standard" else core.rms_norm_offset
    cout, (cx, cw) = _grads(lambda a, b: core_fn(a, b, eps), x, w, cot=cot)
    for got, exp, what in ((out, cout, "out vs core"), (gx, cx, "dx vs core"), (gw, cw, "dw vs core")):
        assert_close(got, exp, "rms_norm", variant, what, dtype)
    (call,) = fake_rms.CALLS
    assert call["weight_offset"] == (0.0 if variant == "standard" else 1.0)
    assert call["eps"] == eps and isinstance(call["eps"], float)
    assert call["bias"] is None and call["residual"] is None and call["out_dtype"] is None and not call["prenorm"]


@pytest.mark.parametrize("x_dtype, w_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                              (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_rms_norm_odd_hidden_is_refused_before_quack_for_16_bit(x_dtype, w_dtype):
    x, w = torch.randn(2, 9, 37, dtype=x_dtype), torch.randn(37, dtype=w_dtype)
    # The stand-in enforces the real kernel's minimum copy width, as the H100 run showed it.
    with pytest.raises(RuntimeError, match="cp_size"):
        fake_rms.rmsnorm(x, w, eps=1e-6)
    fake_rms.CALLS.clear()
    for kernel in (rms.rms_norm_standard, rms.rms_norm_offset):
        with pytest.raises(ValueError, match=r"H = 37 is odd.*Choose another rms_norm kernel"):
            kernel(x, w, 1e-6)
    assert not fake_rms.CALLS


def test_rms_norm_odd_hidden_float32_and_even_unaligned_hidden_run():
    # float32 x and w: 32-bit copies even for odd H. H = 38 (even, not a multiple of 8): 32-bit copies.
    for dtype, h in ((torch.float32, 37), (torch.bfloat16, 38), (torch.float16, 38)):
        x, w = torch.randn(3, h, dtype=dtype), torch.randn(h, dtype=dtype)
        out = rms.rms_norm_offset(x, w, 1e-6)
        assert_close(out, rms_ref64(x, w, 1e-6, "offset"), "rms_norm", "offset", "out", dtype)


def test_rms_norm_float32_weight_with_bf16_input_keeps_the_input_dtype():
    x = torch.randn(4, 48, dtype=torch.bfloat16)
    w = torch.randn(48, dtype=torch.float32)
    out, (gx, gw) = _grads(lambda a, b: rms.rms_norm_standard(a, b, 1e-5), x, w, cot=torch.ones(4, 48))
    assert out.dtype == torch.bfloat16 and gx.dtype == torch.bfloat16 and gw.dtype == torch.float32
    assert_close(out, rms_ref64(x, w, 1e-5, "standard"), "rms_norm", "standard", "out", torch.bfloat16)


def test_rms_norm_passes_aligned_input_without_copy_and_fixes_misaligned_views():
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    w = torch.ones(64, dtype=torch.bfloat16)
    rms.rms_norm_standard(x, w, 1e-6)
    assert fake_rms.CALLS[-1]["x"].data_ptr() == x.data_ptr()
    # A column slice at an odd offset: rows 16-byte apart but the pointer 6 bytes off.
    base = torch.randn(6, 72, dtype=torch.bfloat16)
    view = base[:, 3:67]
    assert not common.fits_layout(view, 8)
    out, (gx, gw) = _grads(lambda a, b: rms.rms_norm_standard(a, b, 1e-6), view, w, cot=torch.ones(6, 64))
    assert_close(out, rms_ref64(view, w, 1e-6, "standard"), "rms_norm", "standard", "out", torch.bfloat16)
    called = fake_rms.CALLS[-1]["x"]
    assert called.is_contiguous() and called.data_ptr() % 16 == 0
    # A transposed (column-major) input and a strided weight.
    xt = torch.randn(40, 5).t()
    wv = torch.randn(80)[::2]
    out, (gx, gw) = _grads(lambda a, b: rms.rms_norm_offset(a, b, 1e-6), xt, wv, cot=torch.ones(5, 40))
    ref, (rx, rw) = _grads(lambda a, b: rms_ref64(a, b, 1e-6, "offset"), xt.double(), wv.double(),
                           cot=torch.ones(5, 40, dtype=torch.float64))
    for got, exp, what in ((out, ref, "out"), (gx, rx, "dx"), (gw, rw, "dw")):
        assert_close(got, exp, "rms_norm", "offset", what, torch.float32)


def test_rms_norm_empty_rows():
    x = torch.randn(0, 3, 16, requires_grad=True)
    w = torch.ones(16, requires_grad=True)
    out = rms.rms_norm_standard(x, w, 1e-6)
    assert out.shape == (0, 3, 16)


@pytest.mark.parametrize(
    "args, err, match",
    [
        ((torch.randn(4, 8, dtype=torch.float64), torch.ones(8, dtype=torch.float64), 1e-6), TypeError, "float64"),
        ((torch.randn(4, 8), torch.ones(7), 1e-6), ValueError, r"weight must have shape \[H\] = \[8\]"),
        ((torch.randn(4, 8), torch.ones(2, 8), 1e-6), ValueError, "weight must have shape"),
        ((torch.randn(4, 8), torch.ones(8), -1.0), ValueError, "eps must be a non-negative"),
        ((torch.randn(4, 8), torch.ones(8), torch.tensor(1e-6)), ValueError, "eps must be"),
        ((torch.randn(4, 8).numpy(), torch.ones(8), 1e-6), TypeError, "must be a torch.Tensor"),
    ],
)
def test_rms_norm_bad_input(args, err, match):
    with pytest.raises(err, match=match):
        rms.rms_norm_standard(*args)


def test_cpu_tensors_are_refused_outside_the_tests(monkeypatch):
    monkeypatch.setattr(common.CHECKS, "device_types", ("cuda",))
    with pytest.raises(ValueError, match=r"Quack's kernels take tensors on CUDA GPUs \(sm 9.0\+\) only"):
        rms.rms_norm_offset(torch.randn(2, 8), torch.zeros(8), 1e-6)
    with pytest.raises(ValueError, match=r"CUDA GPUs \(sm 9.0\+\) only"):
        ce.cross_entropy_sum(torch.randn(2, 8), torch.tensor([1, 2]))


# --------------------------------------------------------------------------- cross_entropy / logits
def ce_ref64(logits, labels, ignore_index=-100):
    return F.cross_entropy(logits.double(), labels.long(), ignore_index=ignore_index, reduction="sum")


def _labels(n, vocab, ignore_index=-100, frac_ignored=0.25):
    y = torch.randint(0, vocab, (n,))
    y[torch.rand(n) < frac_ignored] = ignore_index
    return y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, vocab, ignore_index", [(33, 301, -100), (16, 256, 0), (5, 7, -1)])
def test_cross_entropy_logits_matches_float64_and_core(dtype, n, vocab, ignore_index):
    logits = (torch.randn(n, vocab) * 4).to(dtype)
    labels = _labels(n, vocab, ignore_index)
    labels[0] = ignore_index if ignore_index >= 0 else 1  # an ignore_index that is a real class, or a kept row
    kernel = lambda z: ce.cross_entropy_sum(z, labels, ignore_index=ignore_index)  # noqa: E731
    loss, (g,) = _grads(kernel, logits, cot=torch.tensor(1.7))
    assert loss.dtype == torch.float32 and loss.dim() == 0
    ref, (rg,) = _grads(lambda z: ce_ref64(z, labels, ignore_index), logits.double(), cot=torch.tensor(1.7).double())
    assert_close(loss, ref, "cross_entropy", "logits", "loss", dtype)
    assert_close(g, rg, "cross_entropy", "logits", "dlogits", dtype)
    core = core_kernels("cross_entropy")
    closs, (cg,) = _grads(lambda z: core.cross_entropy_sum(z, labels, ignore_index=ignore_index), logits,
                          cot=torch.tensor(1.7))
    assert_close(loss, closs, "cross_entropy", "logits", "loss vs core", dtype)
    assert_close(g, cg, "cross_entropy", "logits", "dlogits vs core", dtype)
    (call,) = fake_ce.CALLS
    assert call["reduction"] == "sum" and call["inplace_backward"] is False
    assert call["ignore_index"] == ignore_index and call["weight"] is None and call["lse_partial"] is None


def test_cross_entropy_logits_edge_cases():
    # Every label ignored: 0 and zero gradients.
    z = torch.randn(6, 40, requires_grad=True)
    loss = ce.cross_entropy_sum(z, torch.full((6,), -100))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(z.grad, torch.zeros_like(z))
    # No tokens: a differentiable 0, never reaching Quack.
    z0 = torch.randn(0, 40, requires_grad=True)
    loss0 = ce.cross_entropy_sum(z0, torch.zeros(0, dtype=torch.long))
    loss0.backward()
    assert loss0.item() == 0.0 and loss0.dtype == torch.float32 and z0.grad.shape == (0, 40)
    assert not fake_ce.CALLS[1:]
    # int32 labels pass as they are; uint8 become int64; the logits are never written.
    z = torch.randn(8, 24, dtype=torch.bfloat16)
    before = z.clone()
    y32 = torch.randint(0, 24, (8,), dtype=torch.int32)
    ce.cross_entropy_sum(z.requires_grad_(), y32).backward()
    assert fake_ce.CALLS[-1]["target"] is y32 and torch.equal(z.detach(), before)
    ce.cross_entropy_sum(z, y32.to(torch.uint8))
    assert fake_ce.CALLS[-1]["target"].dtype == torch.int64


def test_cross_entropy_logits_fixes_layouts():
    # Transposed logits (stride(-1) != 1) and a slice at an odd vocabulary offset.
    zt = torch.randn(300, 12).t()
    y = torch.randint(0, 300, (12,))
    loss, (g,) = _grads(lambda z: ce.cross_entropy_sum(z, y), zt, cot=torch.tensor(1.0))
    ref, (rg,) = _grads(lambda z: ce_ref64(z, y), zt.double(), cot=torch.tensor(1.0).double())
    assert_close(loss, ref, "cross_entropy", "logits", "loss", torch.float32)
    assert_close(g, rg, "cross_entropy", "logits", "dlogits", torch.float32)
    base = torch.randn(12, 264, dtype=torch.bfloat16)
    zs = base[:, 1:257]
    y = torch.randint(0, 256, (12,))
    loss = ce.cross_entropy_sum(zs, y)
    assert_close(loss, ce_ref64(zs, y), "cross_entropy", "logits", "loss", torch.bfloat16)
    assert fake_ce.CALLS[-1]["x"].data_ptr() % 16 == 0


@pytest.mark.parametrize(
    "logits, labels, kw, err, match",
    [
        (torch.randn(4, 10), torch.tensor([0, 1, 10, 2]), {}, ValueError, r"cross_entropy \(quack\): labels holds 10, outside \[0, 10\)"),
        (torch.randn(4, 10), torch.tensor([0, 1, -5, 2]), {}, ValueError, r"cross_entropy \(quack\): labels holds -5, outside"),
        (torch.randn(4, 10), torch.tensor([0, 1, 2]), {}, ValueError, "labels has 3 entries but there are 4"),
        (torch.randn(4, 10), torch.zeros(4), {}, TypeError, "must be an integer tensor"),
        (torch.randn(2, 4, 10), torch.zeros(8, dtype=torch.long), {}, ValueError, r"2-D \[N, V\]"),
        (torch.randn(4, 10, dtype=torch.float64), torch.zeros(4, dtype=torch.long), {}, TypeError, "float64"),
        (torch.randn(4, 10), torch.zeros(4, dtype=torch.long), {"ignore_index": 2**40}, ValueError, "int32"),
        (torch.randn(4, 10), torch.zeros(4, dtype=torch.long), {"ignore_index": True}, TypeError, "Python int"),
    ],
)
def test_cross_entropy_logits_bad_input(logits, labels, kw, err, match):
    with pytest.raises(err, match=match):
        ce.cross_entropy_sum(logits, labels, **kw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [151936, 100352])
def test_cross_entropy_logits_refuses_vocabularies_whose_tiling_gives_nan(dtype, vocab):
    # The stand-in reproduces the real forward's cluster reduction: a warp with no real column
    # poisons every row with NaN (H100: loss and dlogits not finite at V = 151936, bf16, also
    # after padding to a width without empty warps). The adapter refuses instead.
    z = (torch.randn(3, vocab) * 3).to(dtype)
    y = torch.tensor([5, -100, vocab - 1])
    assert torch.isnan(fake_ce.cross_entropy(z, y, reduction="none")[[0, 2]]).all()  # counted rows
    fake_ce.CALLS.clear()
    with pytest.raises(ValueError, match=rf"V = {vocab} with {str(dtype)[6:]} logits on sm 9.x.*cross_entropy: liger"):
        ce.cross_entropy_sum(z, y)
    assert not fake_ce.CALLS


def test_cross_entropy_logits_strided_rows_are_copied():
    # Quack's backward allocates dX contiguous and requires its row stride to equal X's.
    z = torch.randn(6, 40)[:, :32]
    y = torch.randint(0, 32, (6,))
    fake_ce.CALLS.clear()
    loss, (g,) = _grads(lambda t: ce.cross_entropy_sum(t, y), z, cot=torch.tensor(1.0))
    (call,) = fake_ce.CALLS
    assert call["x"].is_contiguous() and call["x"].stride(0) == 32
    ref, (rg,) = _grads(lambda t: ce_ref64(t, y), z.double(), cot=torch.tensor(1.0).double())
    assert_close(g, rg, "cross_entropy", "logits", "dlogits", torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_logits_odd_vocab(dtype):
    z = torch.randn(1001, 37).to(dtype).t()  # transposed and odd, as the H100 edge case
    y = torch.randint(0, 1001, (37,))
    if dtype != torch.float32:  # the stand-in refuses 16-bit copies as CuTe does
        with pytest.raises(RuntimeError, match="cp_size"):
            fake_ce.cross_entropy(z.contiguous(), y)
        fake_ce.CALLS.clear()
    loss, (g,) = _grads(lambda t: ce.cross_entropy_sum(t, y), z, cot=torch.tensor(1.0))
    (call,) = fake_ce.CALLS
    assert call["x"].shape == (37, 1001 if dtype == torch.float32 else 1008)
    ref, (rg,) = _grads(lambda t: ce_ref64(t, y), z.double(), cot=torch.tensor(1.0).double())
    assert_close(loss, ref, "cross_entropy", "logits", "loss", dtype)
    assert_close(g, rg, "cross_entropy", "logits", "dlogits", dtype)


def test_padded_vocab_plan():
    # Common vocabularies Quack handles as they are (sm 9.0, bf16), and the ones it cannot.
    for v in (32000, 50304, 128256, 129280, 131072, 256000, 262144):
        assert ce.padded_vocab(v, 16, 9) == v
    assert ce.padded_vocab(151936, 32, 9) == 151936  # float32 tiles it fully
    for v in (151936, 100352):
        with pytest.raises(ValueError, match=f"V = {v}"):
            ce.padded_vocab(v, 16, 9)
    assert ce.padded_vocab(1001, 32, 9) == 1001 and ce.padded_vocab(1001, 16, 9) == 1008
    assert ce.padded_vocab(50257, 16, 9) == 50264  # odd 16-bit: next multiple of 8 (passes on the H100)
    for major in (9, 10, 12):
        for bits in (16, 32):
            for v in range(1, 300000, 1999):
                try:
                    p = ce.padded_vocab(v, bits, major)
                except ValueError:
                    w = v if math.gcd(v, 128 // bits) * bits >= 32 else -(-v // 8) * 8
                    assert ce.has_empty_warp(w, bits, major)
                    continue
                assert p >= v and not ce.has_empty_warp(p, bits, major)
                assert p == v or (p == -(-v // 8) * 8 and bits == 16)


# --------------------------------------------------------------------------- cross_entropy / fused_linear
def flce_ref64(h, w, y, ignore_index=-100):
    return F.cross_entropy(h.double() @ w.double().t(), y.long(), ignore_index=ignore_index, reduction="sum")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [21, 64, 1])
def test_fused_linear_matches_float64_and_core(monkeypatch, dtype, n):
    monkeypatch.setattr(lce, "CHUNK_SIZE", 16)  # several chunks at test sizes
    hdim, vocab = 32, 200
    h = (torch.randn(n, hdim) * 0.5).to(dtype)
    w = (torch.randn(vocab, hdim) * 0.2).to(dtype)
    y = _labels(n, vocab)
    y[0] = 3
    cot = torch.tensor(0.8)
    loss, (gh, gw) = _grads(lambda a, b: lce.fused_linear_cross_entropy_sum(a, b, y), h, w, cot=cot)
    assert loss.dtype == torch.float32 and gh.dtype == dtype and gw.dtype == dtype
    ref, (rh, rw) = _grads(lambda a, b: flce_ref64(a, b, y), h.double(), w.double(), cot=cot.double())
    assert_close(loss, ref, "cross_entropy", "fused_linear", "loss", dtype)
    assert_close(gh, rh, "cross_entropy", "fused_linear", "dhidden", dtype)
    assert_close(gw, rw, "cross_entropy", "fused_linear", "dweight", dtype)
    core = core_kernels("cross_entropy")
    closs, (ch, cw) = _grads(lambda a, b: core.fused_linear_cross_entropy_sum(a, b, y), h, w, cot=cot)
    assert_close(loss, closs, "cross_entropy", "fused_linear", "loss vs core", dtype)
    assert_close(gh, ch, "cross_entropy", "fused_linear", "dhidden vs core", dtype)
    assert_close(gw, cw, "cross_entropy", "fused_linear", "dweight vs core", dtype)
    (call,) = fake_lce.CALLS
    assert call["reduction"] == "sum" and call["tuned"] is False and call["chunk_size"] == 16
    assert call["use_scaled_exp"] is None and call["ignore_index"] == -100
    # Padded to a multiple of 8 with ignored rows.
    padded = n + (-n % 8)
    assert call["x"].shape == (padded, hdim) and call["target"].shape == (padded,)
    assert (call["target"][n:] == -100).all() and (call["x"][n:] == 0).all()


def test_fused_linear_grad_subsets_no_grad_and_ignored():
    h = torch.randn(16, 16, dtype=torch.bfloat16)
    w = torch.randn(24, 16, dtype=torch.bfloat16)
    y = torch.randint(0, 24, (16,))
    ref = flce_ref64(h, w, y)
    with torch.no_grad():
        assert_close(lce.fused_linear_cross_entropy_sum(h, w, y), ref, "cross_entropy", "fused_linear", "no_grad",
                     torch.bfloat16)
    # Only the weight needs a gradient (frozen trunk).
    wl = w.clone().requires_grad_()
    lce.fused_linear_cross_entropy_sum(h, wl, y).backward()
    _, (_, rw) = _grads(lambda a, b: flce_ref64(a, b, y), h.double(), w.double(), cot=torch.tensor(1.0).double())
    assert_close(wl.grad, rw, "cross_entropy", "fused_linear", "dweight", torch.bfloat16)
    # Every label ignored: 0 and zero gradients.
    hl, wl = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = lce.fused_linear_cross_entropy_sum(hl, wl, torch.full((16,), -100))
    loss.backward()
    assert loss.item() == 0.0 and not hl.grad.any() and not wl.grad.any()
    # No tokens.
    h0, wl = torch.zeros(0, 16, dtype=torch.bfloat16, requires_grad=True), w.clone().requires_grad_()
    loss = lce.fused_linear_cross_entropy_sum(h0, wl, torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and loss.dtype == torch.float32 and not wl.grad.any()


def test_fused_linear_second_backward_raises():
    h = torch.randn(8, 16, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(24, 16, dtype=torch.bfloat16, requires_grad=True)
    loss = lce.fused_linear_cross_entropy_sum(h, w, torch.randint(0, 24, (8,)))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


def test_fused_linear_fixes_a_misaligned_hidden():
    base = torch.randn(9, 16, dtype=torch.bfloat16)
    h = base.view(-1)[3:3 + 8 * 16].view(8, 16)  # pointer 6 bytes off
    w = torch.randn(24, 16, dtype=torch.bfloat16)
    y = torch.randint(0, 24, (8,))
    loss = lce.fused_linear_cross_entropy_sum(h, w, y)
    assert_close(loss, flce_ref64(h, w, y), "cross_entropy", "fused_linear", "loss", torch.bfloat16)
    assert fake_lce.CALLS[-1]["x"].data_ptr() % 16 == 0


@pytest.mark.parametrize(
    "h, w, kw, err, match",
    [
        (torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(24, 16, dtype=torch.bfloat16),
         {"bias": torch.zeros(24, dtype=torch.bfloat16)}, ValueError, "has no bias"),
        (torch.randn(8, 12, dtype=torch.bfloat16), torch.randn(24, 12, dtype=torch.bfloat16), {}, ValueError,
         "multiples of 8"),
        (torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(25, 16, dtype=torch.bfloat16), {}, ValueError,
         "multiples of 8"),
        (torch.randn(8, 16), torch.randn(24, 16), {}, TypeError, "bfloat16 and float16 only"),
        (torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(24, 16, dtype=torch.float16), {}, TypeError,
         "different dtypes"),
        (torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(24, 8, dtype=torch.bfloat16), {}, ValueError,
         r"must be \[V, H\]"),
    ],
)
def test_fused_linear_bad_input(h, w, kw, err, match):
    with pytest.raises(err, match=match):
        lce.fused_linear_cross_entropy_sum(h, w, torch.zeros(h.shape[0], dtype=torch.long), **kw)
    assert not fake_lce.CALLS


def test_fused_linear_label_out_of_range():
    with pytest.raises(ValueError, match=r"labels holds 24, outside \[0, 24\)"):
        lce.fused_linear_cross_entropy_sum(torch.randn(8, 16, dtype=torch.bfloat16),
                                           torch.randn(24, 16, dtype=torch.bfloat16), torch.full((8,), 24))


@pytest.mark.parametrize("variant", ["logits", "fused_linear"])
def test_kit_all_ignored_cases_against_float64(variant):
    """The conformance kit's all-ignored cases through both adapters, in every dtype the spec
    declares: the sum (0, zero gradients), and the loss as the model gets it, divided by the
    counted tokens or by num_items_in_batch = 0 (nan, as transformers') with transformers' zero
    gradients. Quack's linear cross-entropy scales its stored gradients by the incoming one (the
    stand-in too), which there is 1/0 = inf: the core's division must hand it none."""
    from _helpers import spec_for
    from veomni_ops.testing.cases import harness
    from veomni_ops.testing.runner import check_kernel

    fn = ce.cross_entropy_sum if variant == "logits" else lce.fused_linear_cross_entropy_sum
    spec = spec_for("cross_entropy", variant)
    names = [c.name for c in harness("cross_entropy").cases(variant, "small") if c.name.startswith("all-ignored")]
    assert len(names) >= 3, names  # the sum, divided by the count, by num_items_in_batch = 0
    results = check_kernel(fn, spec, device="cpu", size="small", cases=names)
    assert {(r.case, r.dtype) for r in results} == {(n, d) for n in names for d in spec.dtypes}
    assert all(r.ok for r in results), [r.describe() for r in results if not r.ok]
