"""The helpers the Liger adapters share: the core's input checks, bound to this backend.

Liger's own checks are ``assert`` statements (gone under ``python -O``) or none at all
(an out-of-range label reads out of bounds). The adapters run the core's checks
(:mod:`veomni_ops.kernels.checks`) before any Liger call; every message names the op and
this backend and says how to fix the input. Shape, dtype and device checks cost nothing;
the label and expert-index range checks (one reduction) synchronise with the host, which
Liger's cross-entropy and MoE routing do anyway.
"""

from __future__ import annotations

from veomni_ops.kernels.checks import BackendChecks

#: Liger's Triton kernels take no float64 (its dtype tables stop at float32).
CHECKS = BackendChecks("liger", kernels="Liger's kernels", consequence="Liger's kernel would read out of bounds")
