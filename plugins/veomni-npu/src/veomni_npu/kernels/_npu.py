"""The one import of ``torch_npu``, and the input checks the NPU adapters share.

``torch_npu`` is Ascend's PyTorch adapter: importing it registers the ``npu`` device with
torch and the ``torch_npu.npu_*`` operators. It only imports where the Ascend CANN toolkit
is installed (it loads CANN's shared libraries), so a missing torch_npu or a missing CANN
both fail here, at resolution time, with one message that says what to install.

The checks are the core's (:mod:`veomni_ops.kernels.checks`), tagged "(npu)", plus a
device-type check; the adapters add the documented limits of the Ascend kernels, so a request the kernel cannot serve is a clear error here instead of an opaque
ACL error code (or an out-of-bounds read) on the device.
"""

from __future__ import annotations

from functools import partial

import torch
from veomni_ops.kernels import checks

INSTALL = (
    "install Ascend's PyTorch adapter built for your torch (pip install torch-npu==<your torch version>, "
    "e.g. torch 2.7.1 -> pip install torch-npu==2.7.1; or pip install \"veomni-npu[torch-npu]\"), on a machine "
    "with an Ascend NPU and the Ascend CANN toolkit installed and its environment sourced "
    "(source /usr/local/Ascend/ascend-toolkit/set_env.sh)"
)

try:
    import torch_npu
except (ImportError, OSError) as e:  # OSError: CANN's shared libraries missing or unloadable
    raise ImportError(
        f"the veomni-npu kernels need torch_npu, which failed to import ({type(e).__name__}: {e}). "
        f"To fix: {INSTALL}. Or choose another kernel (e.g. 'eager') for this op."
    ) from e

__all__ = ["torch_npu"]

#: The device type the adapters accept tensors on. The test suite's stand-in torch_npu
#: (plain torch on the CPU) marks itself with ``IS_STAND_IN``; the real one computes on NPUs.
TENSOR_DEVICE = "cpu" if getattr(torch_npu, "IS_STAND_IN", False) else "npu"

#: dtypes the Ascend kernels used here take (none takes float64).
KERNEL_DTYPES = checks.KERNEL_DTYPES
BACKEND = "npu"


def check_tensor(x: torch.Tensor, name: str, op: str) -> torch.Tensor:
    """The core's :func:`~veomni_ops.kernels.checks.check_tensor`, and on the NPU."""
    checks.check_tensor(x, name, op, backend=BACKEND)
    if x.device.type != TENSOR_DEVICE:
        raise ValueError(
            f"{op} (npu): {name} is on {x.device}; the npu kernels take tensors on an Ascend NPU "
            f"(move the model and inputs with .to('npu')), or choose a kernel for {x.device.type}"
        )
    return x


def check_kernel_dtype(x: torch.Tensor, name: str, op: str) -> None:
    check_tensor(x, name, op)
    checks.check_kernel_dtype(x, name, op, backend=BACKEND, kernels="the Ascend kernels")


def check_integer(x: torch.Tensor, name: str, op: str) -> None:
    check_tensor(x, name, op)
    checks.check_integer(x, name, op, backend=BACKEND)


check_same_device = partial(checks.check_same_device, backend=BACKEND)
check_same_dtype = partial(checks.check_same_dtype, backend=BACKEND)
check_ndim = partial(checks.check_ndim, backend=BACKEND)


def check_eps(eps: object, op: str) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f"{op} (npu): eps must be a non-negative Python float, got {eps!r}")
    return float(eps)
