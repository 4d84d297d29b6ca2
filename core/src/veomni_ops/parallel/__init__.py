"""Beyond one device: FSDP2, Ulysses sequence parallelism and expert parallelism around the plan's kernels.

A job's ``parallel:`` section (:class:`ParallelLayout`) lives beside its kernel plan and is
printed with it. Parallelism wraps kernels, it does not replace them: SP is all-to-alls around
whatever attention kernel the plan chose (:mod:`.ulysses`), EP is a dispatch/combine around
whatever experts kernel it chose (:mod:`.expert`); a spec declares whether its kernel can run
under each (``KernelSpec.parallel``). Everything is PyTorch's own distributed stack
(``torch.distributed``, ``DeviceMesh``, FSDP2 ``fully_shard``): gloo on CPU, NCCL on GPU.

* :mod:`.layout` -- the layout, its rank grid and its checks (no torch import);
* :mod:`.runtime` -- :class:`ParallelRuntime`: process groups, meshes, batch sharding, loss;
* :mod:`.fsdp`, :mod:`.ulysses`, :mod:`.expert`, :mod:`.comm` -- the pieces;
* :mod:`.faults` -- one rank raises, every rank ends with its error (:class:`ParallelFailure`);
  :mod:`.hangs` -- a rank that hangs is named when the others' collective times out;
* :mod:`.nodes` -- several nodes: sp/ep groups kept within a node, the store of a restarted attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .layout import FIELDS, ParallelConfigError, ParallelLayout

__all__ = ["FIELDS", "ParallelConfigError", "ParallelFailure", "ParallelLayout", "ParallelRuntime"]

if TYPE_CHECKING:
    from .faults import ParallelFailure
    from .runtime import ParallelRuntime


def __getattr__(name: str) -> Any:
    # The runtime imports torch.distributed: only when used.
    if name == "ParallelRuntime":
        from .runtime import ParallelRuntime

        return ParallelRuntime
    if name == "ParallelFailure":
        from .faults import ParallelFailure

        return ParallelFailure
    raise AttributeError(f"module 'veomni_ops.parallel' has no attribute {name!r}")
