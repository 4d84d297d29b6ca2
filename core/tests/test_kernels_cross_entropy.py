"""cross_entropy kernels: eager logits / fused-linear references and the chunked kernel.

float64 reference forward and backward, transformers' ForCausalLMLoss equivalence (shift,
ignore_index, num_items_in_batch), all-ignored batches, the chunked kernel's memory bound.
"""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from veomni_ops.backends import reference
from veomni_ops.kernels.cross_entropy import (
    chunked_fused_linear_cross_entropy_sum,
    cross_entropy_sum,
    default_chunk_size,
    fused_linear_cross_entropy_sum,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def spec(variant, name):
    return next(s for s in reference.cross_entropy() if s.variant == variant and s.name == name)


def assert_within(actual, expected, tol, what, atol_scale=1.0):
    diff = (actual.double() - expected).abs()
    bad = diff > tol.atol * atol_scale + tol.rtol * expected.abs()
    assert not bad.any(), f"{what}: {int(bad.sum())}/{bad.numel()} outside {tol}; max |diff| {diff.max().item():.3g}"


def ce_sum64(logits, labels, ignore_index=-100):
    z = logits.double()
    valid = labels != ignore_index
    safe = torch.where(valid, labels, 0)
    nll = torch.logsumexp(z, -1) - z.gather(1, safe[:, None])[:, 0]
    return (nll * valid).sum()


def make_labels(n, v, ignore_every=4, ignore_index=-100, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, v, (n,), generator=g)
    labels[::ignore_every] = ignore_index
    return labels


# ----------------------------------------------------------------------------- logits variant


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,v", [(37, 101), (1, 7), (64, 1000)])
def test_logits_vs_float64(dtype, n, v):
    torch.manual_seed(n + v)
    logits = (torch.randn(n, v) * 4).to(dtype).requires_grad_()
    labels = make_labels(n, v, seed=n)
    loss = cross_entropy_sum(logits, labels)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    (g,) = torch.autograd.grad(loss * 0.37, logits)
    z64 = logits.detach().double().requires_grad_()
    loss64 = ce_sum64(z64, labels)
    (g64,) = torch.autograd.grad(loss64 * 0.37, z64)
    tol = spec("logits", "eager").tolerance(str(dtype))
    assert_within(loss, loss64, tol, "loss")
    assert_within(g, g64, tol, "grad logits")


def test_logits_gradcheck_and_int32_labels():
    torch.manual_seed(0)
    z = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([1, -100, 5, 0, 2], dtype=torch.int32)
    assert torch.autograd.gradcheck(lambda t: cross_entropy_sum(t, labels), (z,))
    assert torch.allclose(cross_entropy_sum(z, labels), ce_sum64(z, labels.long()))


# ----------------------------------------------------------------------------- fused linear


def flce_ref64(hidden, weight, labels, bias=None, ignore_index=-100):
    z = hidden.double() @ weight.double().T
    if bias is not None:
        z = z + bias.double()
    return ce_sum64(z, labels, ignore_index)


FUSED = {
    "eager": fused_linear_cross_entropy_sum,
    "chunked": chunked_fused_linear_cross_entropy_sum,
    "chunked_small": lambda *a, **k: chunked_fused_linear_cross_entropy_sum(*a, chunk_size=7, **k),
}


@pytest.mark.parametrize("kernel", list(FUSED))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_linear_vs_float64(kernel, dtype, with_bias):
    torch.manual_seed(11)
    n, h, v = 45, 24, 203
    hidden = torch.randn(n, h).to(dtype).requires_grad_()
    weight = (torch.randn(v, h) / h**0.5).to(dtype).requires_grad_()
    bias = (0.1 * torch.randn(v)).to(dtype).requires_grad_() if with_bias else None
    labels = make_labels(n, v, ignore_every=3, seed=1)
    inputs = [hidden, weight] + ([bias] if with_bias else [])
    loss = FUSED[kernel](hidden, weight, labels, bias=bias)
    assert loss.dtype == torch.float32
    grads = torch.autograd.grad(loss * 0.5, inputs)

    ins64 = [t.detach().double().requires_grad_() for t in inputs]
    loss64 = flce_ref64(ins64[0], ins64[1], labels, ins64[2] if with_bias else None)
    grads64 = torch.autograd.grad(loss64 * 0.5, ins64)
    name = "eager" if kernel == "eager" else "chunked"
    tol = spec("fused_linear", name).tolerance(str(dtype))
    assert_within(loss, loss64, tol, "loss")
    for what, g, g64 in zip(("hidden", "weight", "bias"), grads, grads64):
        assert g.dtype == dtype
        # weight/bias gradients sum over the N tokens
        scale = 1.0 if what == "hidden" else n**0.5
        assert_within(g, g64, tol, f"grad {what}", atol_scale=scale)


def test_chunked_gradcheck_float64():
    torch.manual_seed(0)
    hidden = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(11, dtype=torch.float64, requires_grad=True)
    labels = make_labels(9, 11, ignore_every=4)

    def f(h, w, b):
        return chunked_fused_linear_cross_entropy_sum(h, w, labels, bias=b, chunk_size=4)

    assert torch.autograd.gradcheck(f, (hidden, weight, bias))


@pytest.mark.parametrize("kernel", list(FUSED))
def test_all_labels_ignored(kernel):
    hidden = torch.randn(10, 8, requires_grad=True)
    weight = torch.randn(30, 8, requires_grad=True)
    labels = torch.full((10,), -100)
    loss = FUSED[kernel](hidden, weight, labels)
    assert loss.item() == 0.0
    gh, gw = torch.autograd.grad(loss, (hidden, weight))
    assert torch.count_nonzero(gh) == 0 and torch.count_nonzero(gw) == 0
    assert cross_entropy_sum(torch.randn(3, 5), torch.full((3,), -100)).item() == 0.0


def test_custom_ignore_index_and_non_contiguous_hidden():
    torch.manual_seed(3)
    base = torch.randn(30, 2, 16)
    hidden = base[:, 1]  # strided rows
    assert not hidden.is_contiguous()
    weight = torch.randn(50, 16)
    labels = make_labels(30, 50, ignore_every=5, ignore_index=7, seed=3)
    ref = flce_ref64(hidden, weight, labels, ignore_index=7)
    for fn in FUSED.values():
        assert torch.allclose(fn(hidden, weight, labels, ignore_index=7).double(), ref, rtol=1e-5)


def test_chunked_weight_grad_in_vocabulary_slices(monkeypatch):
    import veomni_ops.ops.cross_entropy.kernel as ce

    torch.manual_seed(6)
    hidden = torch.randn(21, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(37, 8, dtype=torch.float64, requires_grad=True)
    labels = make_labels(21, 37)
    expected = torch.autograd.grad(flce_ref64(hidden, weight, labels), (hidden, weight))
    monkeypatch.setattr(ce, "WEIGHT_GRAD_SLICE_BYTES", 5 * 8 * 8)  # 5 vocabulary rows per slice
    got = torch.autograd.grad(ce.chunked_fused_linear_cross_entropy_sum(hidden, weight, labels, chunk_size=4),
                              (hidden, weight))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_chunked_only_grads_that_are_asked_for_and_no_grad_mode():
    torch.manual_seed(4)
    hidden = torch.randn(20, 8, requires_grad=True)
    weight = torch.randn(40, 8)  # frozen lm_head
    labels = make_labels(20, 40)
    loss = chunked_fused_linear_cross_entropy_sum(hidden, weight, labels, chunk_size=6)
    (gh,) = torch.autograd.grad(loss, hidden)
    hidden2 = hidden.detach().requires_grad_()
    (gh2,) = torch.autograd.grad(fused_linear_cross_entropy_sum(hidden2, weight, labels), hidden2)
    assert torch.allclose(gh, gh2, atol=1e-5)
    with torch.no_grad():
        nograd = chunked_fused_linear_cross_entropy_sum(hidden, weight, labels, chunk_size=6)
    assert not nograd.requires_grad and torch.allclose(nograd, loss)


def test_default_chunk_size():
    assert default_chunk_size(1, 151936) == 1
    assert default_chunk_size(512, 32768) == 64  # >= 8 chunks
    c = default_chunk_size(65536, 151936)
    assert c * 151936 * 4 <= 512 * 2**20 and c % 64 == 0  # a chunk's float32 logits stay within the budget
    assert default_chunk_size(100, 10) == 32  # never below 32 tokens


# ----------------------------------------------------------------------------- transformers ForCausalLMLoss


@pytest.mark.parametrize("ignore_index", [-100, 0])
@pytest.mark.parametrize("use_num_items", [False, True])
def test_sum_over_items_equals_transformers_causal_lm_loss(ignore_index, use_num_items):
    from transformers.loss.loss_utils import ForCausalLMLoss

    torch.manual_seed(5)
    b, s, h, v = 3, 11, 16, 64
    hidden = torch.randn(b, s, h)
    weight = torch.randn(v, h) / 4
    logits = hidden @ weight.T
    labels = torch.randint(1, v, (b, s))
    labels[0, :4] = ignore_index  # a prompt
    labels[2, 7:] = ignore_index  # padding
    # The causal-LM shift as transformers does it: predict token t+1 from position t.
    shift = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:].reshape(-1)
    counted = int((shift != ignore_index).sum())
    # Under gradient accumulation the divisor is the count over the whole accumulated batch.
    num_items = torch.tensor(counted + 13) if use_num_items else None
    expected = ForCausalLMLoss(logits, labels, v, num_items_in_batch=num_items, ignore_index=ignore_index)
    divisor = num_items if use_num_items else counted
    flat_h = hidden.reshape(-1, h)
    for loss_sum in (
        cross_entropy_sum(logits.reshape(-1, v), shift, ignore_index=ignore_index),
        fused_linear_cross_entropy_sum(flat_h, weight, shift, ignore_index=ignore_index),
        chunked_fused_linear_cross_entropy_sum(flat_h, weight, shift, ignore_index=ignore_index, chunk_size=5),
    ):
        torch.testing.assert_close(loss_sum / divisor, expected, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- memory


def peak_bytes(fn, n, h, v, dtype=torch.float32):
    """Peak of live CPU bytes allocated while running fn forward + backward (profiler events)."""
    torch.manual_seed(0)
    hidden = torch.randn(n, h, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, h, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, v, (n,))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(hidden, weight, labels).backward()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    assert peak > 0, "profiler recorded no allocations"
    return peak


@pytest.mark.parametrize("n,h,v", [(512, 64, 32768), (256, 32, 151936)])
def test_chunked_peak_memory_is_a_quarter_of_eager(n, h, v):
    eager = peak_bytes(fused_linear_cross_entropy_sum, n, h, v)
    chunked = peak_bytes(chunked_fused_linear_cross_entropy_sum, n, h, v)
    # The eager path holds [N, V] float32 logits several times over.
    assert eager >= 2 * n * v * 4
    assert chunked <= eager / 4, f"chunked peak {chunked / 2**20:.1f} MiB vs eager {eager / 2**20:.1f} MiB"


# ----------------------------------------------------------------------------- errors


def test_errors():
    h, w = torch.randn(4, 8), torch.randn(10, 8)
    with pytest.raises(TypeError, match="integer tensor"):
        cross_entropy_sum(torch.randn(4, 10), torch.zeros(4))
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        cross_entropy_sum(torch.randn(2, 4, 10), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="labels has 3 entries"):
        cross_entropy_sum(torch.randn(4, 10), torch.zeros(3, dtype=torch.long))
    for fn in FUSED.values():
        with pytest.raises(ValueError, match=r"\[V, H\]"):
            fn(h, torch.randn(10, 7), torch.zeros(4, dtype=torch.long))
        with pytest.raises(TypeError, match="different dtypes"):
            fn(h, w.double(), torch.zeros(4, dtype=torch.long))
        with pytest.raises(ValueError, match=r"bias must have shape \[V\]"):
            fn(h, w, torch.zeros(4, dtype=torch.long), bias=torch.zeros(9))
        with pytest.raises(TypeError, match="integer"):
            fn(h, w, torch.zeros(4))
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_fused_linear_cross_entropy_sum(h, w, torch.zeros(4, dtype=torch.long), chunk_size=0)


# ----------------------------------------------------------------------------- label range


@pytest.mark.parametrize("bad", [10, -1, 1 << 33])
def test_labels_outside_the_vocabulary_raise_naming_the_op_and_label(bad):
    h, w = torch.randn(4, 8), torch.randn(10, 8)
    labels = torch.tensor([0, -100, bad, 9])
    msg = rf"^cross_entropy: labels holds {bad}, outside \[0, 10\) \(the vocabulary size V = 10\); every entry other than ignore_index=-100"
    with pytest.raises(ValueError, match=msg):
        cross_entropy_sum(torch.randn(4, 10), labels)
    for fn in FUSED.values():
        with pytest.raises(ValueError, match=msg):
            fn(h, w, labels)
    # ignore_index is exempt, whatever its value; a real class id as ignore_index still counts as one
    assert torch.isfinite(cross_entropy_sum(torch.randn(4, 10), torch.tensor([0, 77, 77, 9]), ignore_index=77))
    with pytest.raises(ValueError, match="labels holds -100"):
        cross_entropy_sum(torch.randn(4, 10), torch.tensor([0, -100, 3, 9]), ignore_index=3)


def test_label_check_costs_one_reduction_and_is_skipped_on_accelerators_unless_asked(monkeypatch):
    from veomni_ops.kernels import checks
    from veomni_ops.kernels import cross_entropy as CE
    from veomni_ops.ops.cross_entropy import checks as ce_checks

    calls = []
    real = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda x: calls.append(x.shape) or real(x))
    cross_entropy_sum(torch.randn(6, 10), torch.tensor([1, 2, -100, 3, 4, 5]))
    assert calls == [(6,)]  # one reduction over the labels
    # on an accelerator (pretend: can_read_values as it answers for a non-CPU tensor) nothing is read
    # the label-range rule is defined in ops/cross_entropy/checks.py (kernels.checks re-exports it)
    monkeypatch.setattr(ce_checks, "can_read_values", lambda x: checks.value_checks_on())
    calls.clear()
    CE.check_label_values(torch.tensor([1, 50]), 10, -100)
    assert calls == []
    with checks.value_checks(), pytest.raises(ValueError, match="labels holds 50"):
        CE.check_label_values(torch.tensor([1, 50]), 10, -100)
