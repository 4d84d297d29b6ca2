"""Input checks shared by the Liger adapters.

Liger's own checks are ``assert`` statements (gone under ``python -O``) or none at all
(an out-of-range label reads out of bounds). These run before any Liger call and say what
is wrong and how to fix it. Shape, dtype and device checks cost nothing; the value checks
(:func:`check_index_range`) synchronise with the host, which the kernels that call them
(cross-entropy, MoE) do anyway.
"""

from __future__ import annotations

import torch

#: dtypes Liger's Triton kernels accept (no float64: its dtype tables stop at float32).
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_tensor(x: object, name: str, op: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op} (liger): {name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_kernel_dtype(x: torch.Tensor, name: str, op: str) -> None:
    check_tensor(x, name, op)
    if x.dtype not in KERNEL_DTYPES:
        raise TypeError(
            f"{op} (liger): {name} has dtype {x.dtype}; Liger's kernels take float32, bfloat16 or float16 "
            f"(cast it, e.g. {name}.to(torch.bfloat16), or use the 'eager' kernel for float64)"
        )


def check_integer(x: torch.Tensor, name: str, op: str) -> None:
    check_tensor(x, name, op)
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"{op} (liger): {name} has dtype {x.dtype}; it must be an integer tensor (use {name}.long())")


def check_same_device(op: str, **tensors: torch.Tensor | None) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"{op} (liger): inputs are on different devices ({listing}); move them to one device")


def check_same_dtype(op: str, **tensors: torch.Tensor | None) -> None:
    dtypes = {name: t.dtype for name, t in tensors.items() if t is not None}
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{n} {d}" for n, d in dtypes.items())
        raise TypeError(f"{op} (liger): inputs have different dtypes ({listing}); cast them to one dtype")


def check_ndim(x: torch.Tensor, ndim: int, name: str, op: str, layout: str) -> None:
    if x.dim() != ndim:
        raise ValueError(f"{op} (liger): {name} must be {ndim}-D {layout}, got shape {tuple(x.shape)}")


def check_index_range(x: torch.Tensor, upper: int, name: str, op: str, what: str, ignore: int | None = None) -> None:
    """Every entry of ``x`` (except ``ignore``) lies in ``[0, upper)``. Synchronises with the host."""
    if x.numel() == 0:
        return
    bad = (x < 0) | (x >= upper)
    if ignore is not None:
        bad &= x != ignore
    if bool(bad.any()):
        first = x[bad][0].item()
        extra = f" other than ignore_index={ignore}" if ignore is not None else ""
        raise ValueError(
            f"{op} (liger): {name} holds {first}, outside [0, {upper}) ({what}); every entry{extra} must be in "
            f"range -- Liger's kernel would read out of bounds"
        )
