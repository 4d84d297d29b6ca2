"""The helpers the NPU adapters share: the one import of ``torch_npu``, and the core's input checks.

``torch_npu`` is Ascend's PyTorch adapter: importing it registers the ``npu`` device with
torch and the ``torch_npu.npu_*`` operators. It only imports where the Ascend CANN toolkit
is installed (it loads CANN's shared libraries), so a missing torch_npu or a missing CANN
both fail here, at resolution time, with one message that says what to install.

The checks are the core's (:mod:`veomni_ops.kernels.checks`), bound to this backend
(:data:`CHECKS`: tagged "(npu)", no float64, tensors on the NPU); the adapters add the
documented limits of the Ascend kernels, so a request the kernel cannot serve is a clear
error here instead of an opaque ACL error code (or an out-of-bounds read) on the device.
"""

from __future__ import annotations

from veomni_ops.kernels.checks import BackendChecks

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

__all__ = ["CHECKS", "torch_npu"]

#: The device type the adapters accept tensors on. The test suite's stand-in torch_npu
#: (plain torch on the CPU) marks itself with ``IS_STAND_IN``; the real one computes on NPUs.
TENSOR_DEVICE = "cpu" if getattr(torch_npu, "IS_STAND_IN", False) else "npu"

#: The core's checks for the Ascend kernels: none takes float64; tensors on :data:`TENSOR_DEVICE`.
CHECKS = BackendChecks("npu", kernels="the Ascend kernels", device_types=(TENSOR_DEVICE,), runs_on="an Ascend NPU")
