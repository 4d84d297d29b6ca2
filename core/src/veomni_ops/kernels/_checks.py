"""Input checks shared by the core kernels.

They look at shapes, dtypes and devices only, never at values, so they cost no
device-to-host synchronisation and trace under ``torch.compile``.
"""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_tensor(x: object, name: str, op: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_float(x: torch.Tensor, name: str, op: str) -> None:
    check_tensor(x, name, op)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{op}: {name} has dtype {x.dtype}; it must be one of float32, bfloat16, float16, float64 "
            f"(cast it, e.g. {name}.to(torch.bfloat16))"
        )


def check_integer(x: torch.Tensor, name: str, op: str) -> None:
    check_tensor(x, name, op)
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"{op}: {name} has dtype {x.dtype}; it must be an integer tensor (use {name}.long())")


def check_same_device(op: str, **tensors: torch.Tensor | None) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"{op}: inputs are on different devices ({listing}); move them to one device")


def check_same_dtype(op: str, **tensors: torch.Tensor | None) -> None:
    dtypes = {name: t.dtype for name, t in tensors.items() if t is not None}
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{n} {d}" for n, d in dtypes.items())
        raise TypeError(f"{op}: inputs have different dtypes ({listing}); cast them to one dtype")


def check_ndim(x: torch.Tensor, ndim: int, name: str, op: str, layout: str) -> None:
    if x.dim() != ndim:
        raise ValueError(f"{op}: {name} must be {ndim}-D {layout}, got shape {tuple(x.shape)}")
