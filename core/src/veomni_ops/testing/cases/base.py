"""The kit's building blocks: dtypes, the seeded input :class:`Builder`, a :class:`Case`, an
op's :class:`OpHarness`, and small helpers every op's cases use."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

SIZES = ("small", "full")

#: dtype name -> torch dtype
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


class Builder:
    """Random inputs for one case: generated in float64 on the CPU, cast, moved to the device."""

    def __init__(self, seed: int, dtype: torch.dtype, device: torch.device | str):
        self.gen = torch.Generator().manual_seed(int(seed))  # CPU: small integer draws
        self.dtype = dtype
        self.device = torch.device(device)
        if self.device.type == "cpu":
            self.dgen = self.gen
        else:
            self.dgen = torch.Generator(device=self.device).manual_seed(int(seed))

    def _out(self, t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        return t.to(dtype or self.dtype).to(self.device)

    def randn(self, *shape: int, scale: float = 1.0, shift: float = 0.0, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = torch.randn(shape, generator=self.dgen, dtype=torch.float64, device=self.dgen.device) * scale + shift
        return self._out(t, dtype)

    def uniform(self, *shape: int, low: float, high: float, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = torch.rand(shape, generator=self.dgen, dtype=torch.float64, device=self.dgen.device) * (high - low) + low
        return self._out(t, dtype)

    def randint(self, low: int, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=self.gen).to(self.device)

    def randperm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen)

    def perms(self, rows: int, n: int) -> torch.Tensor:
        """``rows`` independent random permutations of ``range(n)`` (CPU, int64)."""
        return torch.rand(rows, n, generator=self.gen).argsort(dim=1)

    def strided(self, *shape: int, pad: int, scale: float = 1.0) -> torch.Tensor:
        """A ``shape`` tensor whose rows are ``pad`` elements longer than its last dimension
        (a slice of a wider buffer): rows are not contiguous, the last dimension is."""
        *lead, last = shape
        return self.randn(*lead, last + pad, scale=scale)[..., :last]

    def bshd(self, b: int, h: int, s: int, d: int, scale: float = 1.0) -> torch.Tensor:
        """``[B, H, S, D]`` as models pass it: a ``[B, S, H, D]`` projection, transposed (a view)."""
        return self.randn(b, s, h, d, scale=scale).transpose(1, 2)


@dataclass(frozen=True)
class Case:
    """One input configuration of an op.

    ``build(builder)`` returns the kernel's inputs by name (see the op's harness for the
    names). ``diff`` names the inputs the contract says backward differentiates (an input
    that is a list contributes each element). ``optional`` marks a form of input a kernel
    may refuse with a clear ``ValueError``/``TypeError``/``NotImplementedError`` (reported
    as unsupported, not as a failure) — used for the attention mask formats, which differ
    per implementation.
    """

    name: str
    build: Callable[[Builder], dict[str, Any]]
    diff: tuple[str, ...]
    about: str = ""
    optional: bool = False


@dataclass(frozen=True)
class OpHarness:
    """How to exercise one op.

    ``call(fn, inputs, reference)`` calls ``fn`` per the contract and returns the outputs
    to compare as a tuple of tensors (``reference`` is True for the float64 eager call,
    which may take a differently formatted input, e.g. the 4-D form of a 2-D mask).
    ``out_dtypes(dtype)`` lists, per output, the dtypes the contract allows for inputs of
    ``dtype``. ``out_masks(inputs)`` optionally marks, per output, which elements count
    (``None`` = all). ``reference[variant]`` is ``"module:function"`` of the core's eager kernel.
    """

    op: str
    out_names: tuple[str, ...]
    reference: dict[str, str]
    call: Callable[[Callable[..., Any], dict[str, Any], bool], tuple[torch.Tensor, ...]]
    out_dtypes: Callable[[torch.dtype], list[tuple[torch.dtype, ...]]]
    cases: Callable[[str, str], list[Case]]
    out_masks: Callable[[dict[str, Any]], list[torch.Tensor | None]] | None = None

    def reference_fn(self, variant: str) -> Callable[..., Any]:
        import importlib

        mod, _, attr = self.reference[variant].partition(":")
        return getattr(importlib.import_module(mod), attr)


def same_dtype(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    return (dtype,)


def loss_dtypes(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    # The contract says float32; a float64 kernel may keep float64 (the eager reference does).
    return (torch.float32, torch.float64) if dtype == torch.float64 else (torch.float32,)


def pick(size: str, small: Sequence[Case], full: Sequence[Case]) -> list[Case]:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; use one of {', '.join(SIZES)}")
    return list(small if size == "small" else full)
