"""The layout contract of Quack's compiled kernels (quack.compile_utils.make_fake_tensor)."""

import math

import torch


def div_for(n, *tensors):
    return math.gcd(n, *(16 // t.element_size() for t in tensors if t is not None))


def assert_layout(t: torch.Tensor, div: int, name: str) -> None:
    """Last stride 1, other strides multiples of ``div``, pointer aligned to ``div`` elements."""
    if t.numel() == 0:
        return
    assert t.stride(-1) == 1, f"stand-in quack: {name} must have stride 1 in its last dimension, got {t.stride()}"
    assert all(s % div == 0 for s in t.stride()[:-1]), f"stand-in quack: {name} strides {t.stride()} not divisible by {div}"
    assert t.data_ptr() % (div * t.element_size()) == 0, f"stand-in quack: {name} is not {div * t.element_size()}-byte aligned"


def assert_copy_width(n: int, *tensors: torch.Tensor | None) -> None:
    """The real kernels copy ``gcd(N, 128 bits / widest element)`` elements of every tensor per
    thread; CuTe refuses a copy narrower than 32 bits at compile time (H100, nvidia-cutlass-dsl
    4.8.1: "'cp_size' only supports (32, 64, 128), but got 16")."""
    ts = [t for t in tensors if t is not None]
    vec = math.gcd(n, 16 // max(t.element_size() for t in ts))
    for t in ts:
        bits = vec * t.element_size() * 8
        if bits < 32:
            raise RuntimeError(f"stand-in quack (CuTe compile error): 'cp_size' only supports (32, 64, 128), but got {bits}")
