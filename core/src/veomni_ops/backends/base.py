"""What the core's own kernel specs share: dtypes, hardware, priorities, tolerance presets, and
the maker of an ``eager`` spec. Each op's specs are in its folder (``veomni_ops/ops/<op>/reference.py``);
:mod:`veomni_ops.backends.reference` registers them. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from veomni_ops.spec import HardwareRequirement, KernelSpec, Tolerance

ALL_DTYPES = ("float32", "bfloat16", "float16", "float64")
ANYWHERE = HardwareRequirement(("any",))
EAGER_PRIORITY = 0
PORTABLE_PRIORITY = 10

# Per-dtype tolerances against the float64 reference, for outputs and gradients
# (|a - b| <= atol + rtol * |b|). Elementwise ops round once or twice in the input dtype;
# reductions over H or V (norm statistics, matmuls, log-softmax sums) need more room.
ELEMENTWISE_TOLERANCES: Mapping[str, Tolerance] = {
    "float64": Tolerance(1e-12, 1e-10),
    "float32": Tolerance(1e-5, 1e-5),
    "bfloat16": Tolerance(1.6e-2, 1.6e-2),
    "float16": Tolerance(2e-3, 2e-3),
}
NORM_TOLERANCES: Mapping[str, Tolerance] = {
    "float64": Tolerance(1e-10, 1e-9),
    "float32": Tolerance(1e-5, 1e-4),
    "bfloat16": Tolerance(3e-2, 2e-2),
    "float16": Tolerance(4e-3, 3e-3),
}
# Matmul-shaped ops (experts, attention): sums over thousands of bf16/fp16-rounded terms. The
# bf16/fp16 values are what PyTorch's own computation in the dtype needs at the conformance
# kit's full shapes: on an H100 (`veomni-ops check --backend veomni-ops`, 2026-11-21) eager
# attention reached 0.091 (bf16) and 0.0103 (fp16) at unit scale, the eager expert loop 0.066
# (bf16); the earlier 0.05 / 0.01 failed PyTorch itself.
MATMUL_TOLERANCES: Mapping[str, Tolerance] = {
    "float64": Tolerance(1e-10, 1e-8),
    "float32": Tolerance(1e-4, 1e-4),
    "bfloat16": Tolerance(1.2e-1, 1.2e-1),
    "float16": Tolerance(2e-2, 2e-2),
}
LOSS_TOLERANCES: Mapping[str, Tolerance] = {
    "float64": Tolerance(1e-10, 1e-9),
    "float32": Tolerance(1e-4, 1e-5),
    "bfloat16": Tolerance(5e-2, 2e-2),
    "float16": Tolerance(1e-2, 5e-3),
}


def core_spec(name: str, op: str, variant: str, factory: str, tolerances: Mapping[str, Tolerance], description: str,
              **kw: Any) -> KernelSpec:
    """One of the core's own specs: ``factory`` is ``"module:attr"``; unless ``kw`` says otherwise
    it runs anywhere, in every dtype, with a backward, under compile, at the ``eager`` priority."""
    fields: dict[str, Any] = dict(hardware=ANYWHERE, supports_backward=True, supports_compile=True, dtypes=ALL_DTYPES,
                                  priority=EAGER_PRIORITY)
    return KernelSpec(name=name, op=op, variant=variant, factory=factory, tolerances=tolerances,
                      description=description, **(fields | kw))


def eager_spec(op: str, variant: str, factory: str, tolerances: Mapping[str, Tolerance], description: str,
               **kw: Any) -> KernelSpec:
    """The ``eager`` spec of ``op``/``variant``: the reference kernel ``factory`` (:func:`core_spec`)."""
    return core_spec("eager", op, variant, factory, tolerances, description, **kw)
