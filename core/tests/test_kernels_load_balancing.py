"""load_balancing_loss eager kernel: transformers' load_balancing_loss_func, float64, errors."""

import pytest
import torch
from veomni_ops.backends import reference
from veomni_ops.kernels.load_balancing import load_balancing_loss


def hf_loss(*args, **kwargs):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    return load_balancing_loss_func(*args, **kwargs)


def ref64(gate_logits, num_experts, top_k, mask=None):
    """Straight from the definition: f_e and P_e over all layers' kept tokens, float64."""
    logits = torch.cat([g.double() for g in gate_logits])  # [L*T, E]
    probs = torch.softmax(logits, -1)
    chosen = torch.zeros_like(probs).scatter_(1, probs.topk(top_k, -1).indices, 1.0)
    keep = torch.ones(logits.shape[0], dtype=torch.float64)
    if mask is not None:
        keep = mask.reshape(-1).double().repeat(len(gate_logits))
    f = (chosen * keep[:, None]).sum(0) / keep.sum()
    p = (probs * keep[:, None]).sum(0) / keep.sum()
    return num_experts * (f * p).sum()


def layers(n_layers, t, e, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(2 * torch.randn(t, e, generator=g)).to(dtype).requires_grad_() for _ in range(n_layers)]


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("e,k", [(8, 2), (5, 1), (16, 4)])
def test_equals_transformers_float32(with_mask, e, k):
    b, s = 3, 7
    gl = layers(4, b * s, e, seed=e + k)
    mask = None
    if with_mask:
        mask = torch.ones(b, s, dtype=torch.long)
        mask[0, 5:] = 0
        mask[2, :3] = 0  # left padding
    ours = load_balancing_loss(tuple(gl), e, k, mask)
    theirs = hf_loss(tuple(gl), e, k, mask)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    g_ours = torch.autograd.grad(ours, gl)
    g_theirs = torch.autograd.grad(theirs, gl)
    for a, b_ in zip(g_ours, g_theirs):
        torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("with_mask", [False, True])
def test_vs_float64(dtype, with_mask):
    b, s, e, k = 2, 9, 6, 2
    gl = layers(3, b * s, e, dtype=dtype, seed=1)
    mask = torch.tensor([[1] * 9, [1] * 4 + [0] * 5]) if with_mask else None
    loss = load_balancing_loss(gl, e, k, mask)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    grads = torch.autograd.grad(loss, gl)
    gl64 = [g.detach().double().requires_grad_() for g in gl]
    loss64 = ref64(gl64, e, k, mask)
    grads64 = torch.autograd.grad(loss64, gl64)
    tol = reference.load_balancing_loss()[0].tolerance(str(dtype))
    assert abs(loss.item() - loss64.item()) <= tol.atol + tol.rtol * abs(loss64.item())
    for g, g64 in zip(grads, grads64):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), g64, rtol=tol.rtol, atol=tol.atol)


def test_gradcheck_float64():
    gl = layers(2, 6, 4, dtype=torch.float64, seed=2)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert torch.autograd.gradcheck(lambda a, b: load_balancing_loss([a, b], 4, 2, mask), tuple(gl))


def test_accepts_list_and_tuple_and_bool_mask():
    gl = layers(2, 6, 4, seed=3)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    a = load_balancing_loss(gl, 4, 2, mask)
    b = load_balancing_loss(tuple(gl), 4, 2, mask.long())
    assert torch.equal(a, b)


def test_errors():
    gl = layers(2, 6, 4, seed=4)
    with pytest.raises(ValueError, match="empty"):
        load_balancing_loss((), 4, 2)
    with pytest.raises(TypeError, match="tuple or list"):
        load_balancing_loss(gl[0], 4, 2)
    with pytest.raises(TypeError, match="tuple or list"):
        load_balancing_loss(None, 4, 2)
    with pytest.raises(ValueError, match="has 4 experts"):
        load_balancing_loss(gl, 5, 2)
    with pytest.raises(ValueError, match="top_k"):
        load_balancing_loss(gl, 4, 5)
    with pytest.raises(ValueError, match="tokens"):
        load_balancing_loss([gl[0], gl[1][:5]], 4, 2)
    with pytest.raises(ValueError, match="attention_mask"):
        load_balancing_loss(gl, 4, 2, torch.ones(2, 4))


@pytest.mark.parametrize("case", ["all-masked", "zero-tokens", "zero-tokens-with-mask"])
def test_no_token_counted_gives_zero_not_nan(case):
    # transformers divides 0 by 0 here (NaN); the contract's value is 0 with zero gradients
    if case == "all-masked":
        gl, mask = layers(3, 8, 4, seed=6), torch.zeros(2, 4, dtype=torch.long)
    else:
        gl = layers(2, 0, 4, seed=6)
        mask = torch.zeros(0, 3, dtype=torch.long) if case.endswith("mask") else None
    loss = load_balancing_loss(gl, 4, 2, mask)
    assert loss.item() == 0.0
    grads = torch.autograd.grad(loss, gl)
    assert all(torch.isfinite(g).all() and not g.any() for g in grads)
