"""The cross-entropy adapters run Liger's real kernels (GPU, or the Triton interpreter on CPU).

Liger's CE kernel upcasts to float32 before any arithmetic, so bfloat16 runs under the
interpreter too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import veomni_liger.kernels.cross_entropy as ce
from _helpers import assert_close, core_kernels, spec_for

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _labels(n: int, vocab: int, device, ignored: int = 3) -> torch.Tensor:
    labels = torch.randint(0, vocab, (n,), device=device)
    labels[torch.randperm(n)[:ignored]] = -100
    labels[0] = vocab - 1  # the last class is reachable
    return labels


def _ref_ce_sum(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    return F.cross_entropy(logits.double(), labels, ignore_index=ignore_index, reduction="sum")


# ---------------------------------------------------------------------------------------
# logits variant
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_logits_forward_backward_against_float64(device, dtype):
    n, vocab = 9, 37
    logits = (3 * torch.randn(n, vocab, device=device)).to(dtype)
    labels = _labels(n, vocab, device)
    x = logits.clone().requires_grad_()
    loss = ce.cross_entropy_sum(x, labels)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    x64 = logits.double().requires_grad_()
    ref = _ref_ce_sum(x64, labels)
    assert_close(loss, ref, "cross_entropy", "logits", "loss", dtype)
    # The core divides the sum by the token count: the upstream gradient is not 1.
    (loss / 6).backward()
    (ref / 6).backward()
    assert x.grad.dtype == dtype
    assert_close(x.grad, x64.grad, "cross_entropy", "logits", "dlogits")
    assert (x.grad[labels == -100] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_logits_matches_the_core_reference(device, dtype):
    core = core_kernels("cross_entropy")
    n, vocab = 11, 29
    logits = torch.randn(n, vocab, device=device).to(dtype)
    labels = _labels(n, vocab, device)
    x = logits.clone().requires_grad_()
    y = logits.clone().requires_grad_()
    a = ce.cross_entropy_sum(x, labels)
    b = core.cross_entropy_sum(y, labels)
    assert_close(a, b, "cross_entropy", "logits", "loss vs core eager", dtype)
    a.backward()
    b.backward()
    assert_close(x.grad, y.grad, "cross_entropy", "logits", "dlogits vs core eager")


def test_logits_all_ignored_gives_zero_and_zero_gradients(device):
    logits = torch.randn(5, 13, device=device, requires_grad=True)
    labels = torch.full((5,), -100, device=device)
    loss = ce.cross_entropy_sum(logits, labels)
    assert loss.item() == 0.0 and torch.isfinite(loss)
    (loss / 1).backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_logits_custom_ignore_index_and_int32_labels(device):
    logits = torch.randn(6, 10, device=device)
    labels = torch.tensor([1, 7, 7, 0, 9, 3], device=device, dtype=torch.int32)
    loss = ce.cross_entropy_sum(logits.clone().requires_grad_(), labels, ignore_index=7)
    ref = _ref_ce_sum(logits, labels.long(), ignore_index=7)
    assert_close(loss, ref, "cross_entropy", "logits", "loss ignore_index=7")


def test_logits_column_strided_input_gets_the_right_gradient(device):
    # Liger 0.8.5's own Function returns the raw logits as their gradient for this layout.
    n, vocab = 7, 12
    base = torch.randn(vocab, n, device=device)
    x = base.clone().requires_grad_()
    logits = x.t()  # stride(-1) != 1
    labels = _labels(n, vocab, device, ignored=1)
    loss = ce.cross_entropy_sum(logits, labels)
    loss.backward()
    x64 = base.double().requires_grad_()
    _ref_ce_sum(x64.t(), labels).backward()
    assert_close(x.grad, x64.grad, "cross_entropy", "logits", "dlogits (column-strided)")


def test_logits_are_not_written_without_grad(device):
    labels = _labels(4, 9, device, ignored=0)
    logits = torch.randn(4, 9, device=device, requires_grad=True)
    before = logits.detach().clone()
    with torch.no_grad():
        loss = ce.cross_entropy_sum(logits, labels)
    assert torch.equal(logits.detach(), before)
    assert_close(loss, _ref_ce_sum(before, labels), "cross_entropy", "logits", "loss under no_grad")
    plain = torch.randn(4, 9, device=device)  # requires no grad
    plain_before = plain.clone()
    ce.cross_entropy_sum(plain, labels)
    assert torch.equal(plain, plain_before)


def test_logits_overwrite_is_visible_to_autograd(device):
    logits = torch.randn(4, 9, device=device, requires_grad=True)
    h = logits * 1.0  # a non-leaf, as a model's logits are
    labels = _labels(4, 9, device, ignored=0)
    z = (h**2).sum()  # PowBackward saves h for its backward
    loss = ce.cross_entropy_sum(h, labels) + z
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_logits_second_backward_raises_instead_of_double_scaling(device):
    logits = torch.randn(4, 9, device=device, requires_grad=True)
    loss = ce.cross_entropy_sum(logits * 1.0, _labels(4, 9, device, ignored=0)) / 4
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_logits_float16_sum_does_not_overflow(device):
    # Liger's own reduction="sum" adds in float16 and overflows past 65504. Four tokens of
    # ~30000 nats each (the per-token losses still fit in float16) sum to ~120000.
    n, vocab = 4, 8
    logits = torch.zeros(n, vocab, device=device)
    logits[:, 0] = 30000.0
    labels = torch.full((n,), 1, device=device)
    loss = ce.cross_entropy_sum(logits.half().requires_grad_(), labels)
    ref = _ref_ce_sum(logits.half(), labels)
    assert ref.item() > 65504
    assert_close(loss, ref, "cross_entropy", "logits", "float16 large sum", torch.float16)


def test_logits_zero_tokens(device):
    logits = torch.randn(0, 5, device=device, requires_grad=True)
    loss = ce.cross_entropy_sum(logits, torch.zeros(0, dtype=torch.long, device=device))
    assert loss.item() == 0.0 and loss.dtype == torch.float32
    loss.backward()
    assert logits.grad.shape == (0, 5)


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda d: (torch.randn(3, 5, device=d), torch.tensor([0, 5, 1], device=d)), ValueError, "outside"),
        (lambda d: (torch.randn(3, 5, device=d), torch.tensor([0, -2, 1], device=d)), ValueError, "outside"),
        (lambda d: (torch.randn(3, 5, device=d), torch.tensor([0, 1], device=d)), ValueError, "tokens"),
        (lambda d: (torch.randn(3, 5, device=d), torch.tensor([0.0, 1, 2], device=d)), TypeError, "integer"),
        (lambda d: (torch.randn(3, 5, device=d).double(), torch.tensor([0, 1, 2], device=d)), TypeError, "float64"),
        (lambda d: (torch.randn(1, 3, 5, device=d), torch.tensor([0, 1, 2], device=d)), ValueError, "2-D"),
    ],
)
def test_logits_bad_inputs(device, make, exc, match):
    logits, labels = make(device)
    with pytest.raises(exc, match=match):
        ce.cross_entropy_sum(logits, labels)


# ---------------------------------------------------------------------------------------
# fused_linear variant
# ---------------------------------------------------------------------------------------


def _ref_flce(hidden, weight, labels, bias=None):
    logits = F.linear(hidden.double(), weight.double(), None if bias is None else bias.double())
    return _ref_ce_sum(logits, labels)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("chunks", ["one-chunk", "liger-default-chunks"])
def test_fused_linear_forward_backward_against_float64(device, dtype, with_bias, chunks, monkeypatch):
    # With the adapter's budget the 19 tokens fit one chunk; with a 1-byte budget the adapter
    # falls back to Liger's own rule, where V = 40 > H = 16 splits them into 3 chunks (the
    # last one short) and the weight gradient is accumulated across chunks.
    if chunks == "liger-default-chunks":
        monkeypatch.setattr(ce, "CHUNK_LOGITS_BUDGET_BYTES", 1)
    n, hdim, vocab = 19, 16, 40
    hidden = torch.randn(n, hdim, device=device).to(dtype)
    weight = (torch.randn(vocab, hdim, device=device) / 2).to(dtype)
    bias = torch.randn(vocab, device=device).to(dtype) if with_bias else None
    labels = _labels(n, vocab, device, ignored=5)
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    b = bias.clone().requires_grad_() if with_bias else None
    loss = ce.fused_linear_cross_entropy_sum(h, w, labels, bias=b)
    assert loss.dtype == torch.float32
    h64 = hidden.double().requires_grad_()
    w64 = weight.double().requires_grad_()
    b64 = bias.double().requires_grad_() if with_bias else None
    ref = _ref_flce(h64, w64, labels, b64)
    assert_close(loss, ref, "cross_entropy", "fused_linear", "loss", dtype)
    (loss / 32).backward()
    (ref / 32).backward()
    assert h.grad.dtype == w.grad.dtype == dtype
    assert_close(h.grad, h64.grad, "cross_entropy", "fused_linear", "dhidden")
    assert_close(w.grad, w64.grad, "cross_entropy", "fused_linear", "dweight")
    if with_bias:
        assert_close(b.grad, b64.grad, "cross_entropy", "fused_linear", "dbias")
    # Inputs are never written (the gradients live in Liger's own buffers).
    assert torch.equal(h.detach(), hidden) and torch.equal(w.detach(), weight)


def test_fused_linear_matches_the_core_references(device):
    core = core_kernels("cross_entropy")
    n, hdim, vocab = 21, 8, 40
    hidden = torch.randn(n, hdim, device=device)
    weight = torch.randn(vocab, hdim, device=device)
    labels = _labels(n, vocab, device)
    grads = {}
    for name, fn in [("liger", ce.fused_linear_cross_entropy_sum), ("eager", core.fused_linear_cross_entropy_sum)]:
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = fn(h, w, labels)
        loss.backward()
        grads[name] = (loss, h.grad, w.grad)
    for i, what in enumerate(["loss", "dhidden", "dweight"]):
        assert_close(grads["liger"][i], grads["eager"][i], "cross_entropy", "fused_linear", f"{what} vs core eager")


def test_fused_linear_all_ignored(device):
    h = torch.randn(6, 8, device=device, requires_grad=True)
    w = torch.randn(20, 8, device=device, requires_grad=True)
    b = torch.randn(20, device=device, requires_grad=True)
    loss = ce.fused_linear_cross_entropy_sum(h, w, torch.full((6,), -100, device=device), bias=b)
    assert loss.item() == 0.0
    (loss / 1).backward()
    for t in (h, w, b):
        assert torch.equal(t.grad, torch.zeros_like(t))


def test_fused_linear_weight_gradient_without_hidden_gradient(device):
    # Liger computes the weight gradient only when *hidden* requires grad; the adapter copes.
    n, hdim, vocab = 10, 8, 24
    hidden = torch.randn(n, hdim, device=device)  # e.g. a frozen trunk
    w = torch.randn(vocab, hdim, device=device, requires_grad=True)
    labels = _labels(n, vocab, device)
    ce.fused_linear_cross_entropy_sum(hidden, w, labels).backward()
    w64 = w.detach().double().requires_grad_()
    _ref_flce(hidden, w64, labels).backward()
    assert w.grad is not None
    assert_close(w.grad, w64.grad, "cross_entropy", "fused_linear", "dweight (hidden frozen)")


def test_fused_linear_asks_liger_only_for_needed_work(device, monkeypatch):
    seen = []
    real = ce.fused_linear_cross_entropy_forward

    def spy(**kw):
        seen.append({"h": kw["_input"].requires_grad, "w": kw["weight"].requires_grad,
                     "reduction": kw["reduction"], "accum": kw["accum_dtype"], "c": kw["chunk_mem_const"]})
        return real(**kw)

    monkeypatch.setattr(ce, "fused_linear_cross_entropy_forward", spy)
    h = torch.randn(5, 8, device=device, requires_grad=True)
    w = torch.randn(12, 8, device=device, requires_grad=True)
    labels = _labels(5, 12, device, ignored=0)
    with torch.no_grad():
        ce.fused_linear_cross_entropy_sum(h, w, labels)
    ce.fused_linear_cross_entropy_sum(h.bfloat16(), w.bfloat16(), labels)
    assert seen[0] == {"h": False, "w": False, "reduction": "sum", "accum": None, "c": 2}
    assert seen[1] == {"h": True, "w": True, "reduction": "sum", "accum": torch.float32, "c": 2}


def _liger_chunk_tokens(n, hdim, vocab, c):
    # Liger 0.8.5's rule (liger_kernel/ops/fused_linear_cross_entropy.py)
    inc = -(-vocab // (c * hdim))
    return min(1 << (-(-n // inc) - 1).bit_length(), n)


@pytest.mark.parametrize("n", [1, 19, 4096, 8192, 16384, 32768, 100_000])
def test_fused_linear_chunk_size_stays_within_the_budget(n):
    hdim, vocab, budget = 2560, 151936, ce.CHUNK_LOGITS_BUDGET_BYTES
    c = ce.chunk_mem_const(n, hdim, vocab, 2, budget)
    tokens = _liger_chunk_tokens(n, hdim, vocab, c)
    default = _liger_chunk_tokens(n, hdim, vocab, 1)
    assert tokens * vocab * 2 <= budget or c == 1
    # as large as the budget allows: one more step would either exceed it or change nothing
    assert tokens == n or _liger_chunk_tokens(n, hdim, vocab, c + 1) * vocab * 2 > budget
    if n >= 2048:
        assert tokens == 2048 and default <= tokens  # 8192 tokens on the H100: 4 chunks of 2048, not 32 of 256
    if n == 8192:
        assert default == 256


def test_fused_linear_second_backward_raises(device):
    h = torch.randn(5, 8, device=device, requires_grad=True)
    w = torch.randn(12, 8, device=device, requires_grad=True)
    loss = ce.fused_linear_cross_entropy_sum(h, w, _labels(5, 12, device, ignored=0)) / 5
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_fused_linear_non_contiguous_hidden(device):
    n, hdim, vocab = 9, 8, 30
    base = torch.randn(hdim, n, device=device, requires_grad=True)
    w = torch.randn(vocab, hdim, device=device, requires_grad=True)
    labels = _labels(n, vocab, device)
    ce.fused_linear_cross_entropy_sum(base.t(), w, labels).backward()
    b64 = base.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    _ref_flce(b64.t(), w64, labels).backward()
    assert_close(base.grad, b64.grad, "cross_entropy", "fused_linear", "dhidden (transposed)")
    assert_close(w.grad, w64.grad, "cross_entropy", "fused_linear", "dweight (transposed hidden)")


def test_fused_linear_zero_tokens(device):
    h = torch.randn(0, 8, device=device, requires_grad=True)
    w = torch.randn(12, 8, device=device, requires_grad=True)
    loss = ce.fused_linear_cross_entropy_sum(h, w, torch.zeros(0, dtype=torch.long, device=device))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(w.grad, torch.zeros_like(w))


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        ({"labels": torch.tensor([0, 12, 1])}, ValueError, "outside"),
        ({"weight": torch.randn(12, 7)}, ValueError, r"\[V, H\]"),
        ({"bias": torch.randn(11)}, ValueError, "bias"),
        ({"weight": torch.randn(12, 8).bfloat16()}, TypeError, "different dtypes"),
        ({"hidden": torch.randn(3, 8).double(), "weight": torch.randn(12, 8).double()}, TypeError, "float64"),
        ({"ignore_index": 1.5}, TypeError, "ignore_index"),
    ],
)
def test_fused_linear_bad_inputs(kw, exc, match):
    args = {"hidden": torch.randn(3, 8), "weight": torch.randn(12, 8), "labels": torch.tensor([0, 1, 2])}
    extra = {k: kw.pop(k) for k in ("bias", "ignore_index") if k in kw}
    args.update(kw)
    with pytest.raises(exc, match=match):
        ce.fused_linear_cross_entropy_sum(args["hidden"], args["weight"], args["labels"], **extra)


@pytest.mark.parametrize("variant", ["logits", "fused_linear"])
def test_kit_all_ignored_cases_against_float64(device, variant):
    """The conformance kit's all-ignored cases, in every dtype the spec declares: the sum (0, zero
    gradients), and the loss as the model gets it, divided by the counted tokens or by
    num_items_in_batch = 0 (nan, as transformers') with transformers' zero gradients. Liger scales
    its stored gradients by the incoming one, which there is 1/0 = inf: the core's division must
    hand it none."""
    from veomni_ops.testing.cases import harness
    from veomni_ops.testing.runner import check_kernel

    fn = ce.cross_entropy_sum if variant == "logits" else ce.fused_linear_cross_entropy_sum
    spec = spec_for("cross_entropy", variant)
    names = [c.name for c in harness("cross_entropy").cases(variant, "small") if c.name.startswith("all-ignored")]
    assert len(names) >= 3, names  # the sum, divided by the count, by num_items_in_batch = 0
    results = check_kernel(fn, spec, device=device, size="small", cases=names)
    assert {(r.case, r.dtype) for r in results} == {(n, d) for n in names for d in spec.dtypes}
    assert all(r.ok for r in results), [r.describe() for r in results if not r.ok]
