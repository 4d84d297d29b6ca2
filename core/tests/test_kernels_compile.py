"""Every reference spec that declares ``supports_compile`` traces under
``torch.compile(fullgraph=True)`` (no graph break), forward and backward, and gives the
eager result; the one that does not declare it (the eager MoE loop) indeed breaks.

CPU CI uses the ``aot_eager`` backend (Dynamo + AOTAutograd, which is where graph breaks and
unsupported ops show up). An inductor case (C++ codegen, about two minutes cold on two
cores) runs when ``VEOMNI_OPS_TEST_INDUCTOR=1``.
"""

import importlib
import os
import shutil

import pytest
import torch
from veomni_ops.backends import reference

HOOKS = ("rms_norm", "residual_rms_norm", "rotary", "swiglu", "cross_entropy", "moe_experts", "load_balancing_loss",
         "attention")
SPECS = [s for hook in HOOKS for s in getattr(reference, hook)()]


def load(spec):
    module, _, attr = spec.factory.partition(":")
    return getattr(importlib.import_module(module), attr)


class Attn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.num_key_value_groups = 2
        self.head_dim = 8
        self.is_causal = True


def example(spec):
    """(callable taking tensors, list of tensors requiring grad, dtype) for one spec."""
    torch.manual_seed(0)
    dt = torch.bfloat16 if spec.name == "grouped_mm" else torch.float32
    kernel = load(spec)

    def r(*shape):
        return torch.randn(*shape, dtype=dt, requires_grad=True)

    op, variant = spec.op, spec.variant
    if op == "rms_norm":
        return (lambda x, w: kernel(x, w, 1e-6)), [r(3, 5, 16), r(16)]
    if op == "residual_rms_norm":
        return (lambda x, res, w: kernel(x, res, w, 1e-6)), [r(3, 5, 16), r(3, 5, 16), r(16)]
    if op == "rotary":
        rdim = 8 if variant == "full" else 4
        cos, sin = torch.randn(1, 3, rdim).cos(), torch.randn(1, 3, rdim).sin()
        return (lambda q, k: kernel(q, k, cos, sin)), [r(1, 2, 3, 8), r(1, 1, 3, 8)]
    if op == "swiglu":
        return kernel, [r(3, 8), r(3, 8)]
    if op == "cross_entropy":
        labels = torch.tensor([1, -100, 3, 9, 0, 2])
        if variant == "logits":
            return (lambda z: kernel(z, labels)), [r(6, 10)]
        if spec.name == "chunked":
            return (lambda h, w: kernel(h, w, labels, chunk_size=4)), [r(6, 8), r(10, 8)]
        return (lambda h, w: kernel(h, w, labels)), [r(6, 8), r(10, 8)]
    if op == "moe_experts":
        idx = torch.tensor([[0, 2], [2, 2], [0, 1], [1, 0], [2, 0]])
        return (lambda x, w, gu, dn: kernel(x, idx, w, gu, dn)), [r(5, 8), r(5, 2), r(3, 16, 8), r(3, 8, 8)]
    if op == "load_balancing_loss":
        mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
        return (lambda a, b: kernel([a, b], 4, 2, mask)), [r(6, 4), r(6, 4)]
    if op == "attention":
        mod = Attn()
        causal = torch.full((4, 4), torch.finfo(dt).min).triu(1)[None, None]
        mask = causal if spec.name == "eager" else None
        return (lambda q, k, v: kernel(mod, q, k, v, mask)[0]), [r(1, 2, 4, 8), r(1, 1, 4, 8), r(1, 1, 4, 8)]
    raise AssertionError(f"no example for {spec.key}")


def run(fn, inputs):
    out = fn(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    loss = sum((o.float() * (i + 1)).sum() for i, o in enumerate(out))
    return out, torch.autograd.grad(loss, inputs)


def test_every_reference_spec_has_an_example():
    assert len(SPECS) == 15  # 11 op/variant pairs with eager, plus sdpa, chunked, grouped_mm, flex_attention
    for spec in SPECS:
        example(spec)


def _on_cpu(spec):
    """flex_attention runs on CUDA only (FlexAttention has no CPU backward): its forward trace on the
    CPU is test_kernels_attention.py::test_flex_traces_fullgraph_on_the_cpu_forward."""
    if {"cpu", "any"} & set(spec.hardware.device_types):
        return spec
    return pytest.param(spec, marks=pytest.mark.skip(reason=f"{spec.name} runs on {spec.hardware.describe()} only"))


@pytest.mark.parametrize("spec", [_on_cpu(s) for s in SPECS if s.supports_compile], ids=lambda s: "/".join(s.key))
def test_compiles_fullgraph(spec):
    torch._dynamo.reset()
    fn, inputs = example(spec)
    out_e, grads_e = run(fn, inputs)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    out_c, grads_c = run(compiled, inputs)
    for a, b in zip(out_e + grads_e, out_c + grads_c):
        torch.testing.assert_close(a, b)


def test_eager_moe_does_not_compile_fullgraph_as_declared():
    spec = next(s for s in SPECS if s.key == ("moe_experts", "standard", "eager"))
    assert not spec.supports_compile
    torch._dynamo.reset()
    fn, inputs = example(spec)
    with pytest.raises(Exception, match="(?i)graph break|data-dependent|dynamic|nonzero"):
        torch.compile(fn, backend="aot_eager", fullgraph=True)(*inputs)


@pytest.mark.skipif(os.environ.get("VEOMNI_OPS_TEST_INDUCTOR") != "1", reason="slow: set VEOMNI_OPS_TEST_INDUCTOR=1")
@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="inductor needs a C compiler")
def test_inductor_rms_norm_and_swiglu():
    from veomni_ops.kernels.rms_norm import rms_norm_standard
    from veomni_ops.kernels.swiglu import silu_mul

    torch._dynamo.reset()

    def block(x, w, up):
        return silu_mul(rms_norm_standard(x, w, 1e-6), up)

    x, w, up = torch.randn(4, 32, requires_grad=True), torch.randn(32, requires_grad=True), torch.randn(4, 32)
    ref = block(x, w, up)
    gref = torch.autograd.grad(ref.sum(), (x, w))
    compiled = torch.compile(block, fullgraph=True)
    got = compiled(x, w, up)
    gcomp = torch.autograd.grad(got.sum(), (x, w))
    torch.testing.assert_close(got, ref)
    for a, b in zip(gcomp, gref):
        torch.testing.assert_close(a, b)
