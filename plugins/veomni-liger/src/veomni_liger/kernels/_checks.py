"""The core's input checks (:mod:`veomni_ops.kernels.checks`), tagged "(liger)".

Liger's own checks are ``assert`` statements (gone under ``python -O``) or none at all
(an out-of-range label reads out of bounds). The adapters run these before any Liger call;
every message names the op and this backend and says how to fix the input. Shape, dtype
and device checks cost nothing; :func:`check_index_range` (one reduction) synchronises with
the host, which Liger's cross-entropy does anyway (the MoE adapter applies the core's
``check_expert_index`` the same way, always: Liger's routing synchronises too). Only the backend's tag and dtype
set are bound here: the checks themselves are the core's.
"""

from __future__ import annotations

from functools import partial

from veomni_ops.kernels import checks

BACKEND = "liger"
#: dtypes Liger's Triton kernels accept (no float64: its dtype tables stop at float32).
KERNEL_DTYPES = checks.KERNEL_DTYPES

check_tensor = partial(checks.check_tensor, backend=BACKEND)
check_kernel_dtype = partial(checks.check_kernel_dtype, backend=BACKEND, kernels="Liger's kernels")
check_integer = partial(checks.check_integer, backend=BACKEND)
check_same_device = partial(checks.check_same_device, backend=BACKEND)
check_same_dtype = partial(checks.check_same_dtype, backend=BACKEND)
check_ndim = partial(checks.check_ndim, backend=BACKEND)
check_index_range = partial(
    checks.check_index_range, backend=BACKEND, consequence="Liger's kernel would read out of bounds"
)
