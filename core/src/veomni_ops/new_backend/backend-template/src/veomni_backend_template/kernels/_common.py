"""What this backend's kernels share: the core's input checks, bound to this backend.

Every backend keeps this module under this name (``kernels/_common.py``). The checks are
veomni-ops' own (:mod:`veomni_ops.kernels.checks`): one :class:`BackendChecks` tags every
message with the op and this backend (``"swiglu (template): ..."``) and knows the dtypes
(and, for a device-bound backend, the device types) the kernels take.
"""

from __future__ import annotations

from veomni_ops.kernels.checks import FLOAT_DTYPES, BackendChecks

#: float64 too: the kernels' math is plain PyTorch (float64 stays float64).
CHECKS = BackendChecks("template", kernels="the kernels of veomni-backend-template", dtypes=FLOAT_DTYPES)
