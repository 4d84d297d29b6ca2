"""What ``veomni-ops bench`` measures: the presets (named shapes per op), the minimal bytes or
FLOPs of each op (:data:`FORMULAS`), and the inputs of one workload in the form the
conformance harness (:mod:`veomni_ops.testing.cases`) calls kernels with.

Each op's part is its folder's ``bench`` module (``veomni_ops/ops/<op>/bench.py``, light):
``FORMULAS`` (its bytes or FLOPs), ``IN_PRESETS`` (its workloads in the presets every op adds
to: :data:`SHARED`), ``PRESETS`` (its own), ``GPU_DEFAULT`` (which of those the default GPU run
takes) and ``build_inputs(workload, draws)``. This module gathers them. A new preset of one op
is one entry in its folder; a new preset across ops, one entry in :data:`SHARED`. Every kernel
registered for a workload's op and variant is measured beside ``eager`` (see
:mod:`veomni_ops.bench.loop`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..ops import OP_DEFS
from ..ops.base import OpWorkload

PASSES = ("fwd", "fwd+bwd")


@dataclass(frozen=True)
class Workload:
    """One op at one shape and dtype. ``build(device)`` returns the harness inputs (see
    :mod:`veomni_ops.testing.cases`); ``diff`` the differentiable ones; ``metric`` is
    ``"bytes"`` or ``"flops"`` and ``amount(pass)`` its minimal amount for that pass.
    ``logits`` (cross-entropy only): how the logits are distributed, ``"peaked"`` or ``"dense"``
    (see :data:`veomni_ops.ops.cross_entropy.bench.LOGITS`)."""

    preset: str
    op: str
    variant: str
    dtype: str
    shape: dict[str, int]
    metric: str
    formula: str  # the op's formula key in FORMULAS
    logits: str = ""  # cross_entropy: a key of its LOGITS ("" is "peaked")

    def amount(self, pass_: str) -> float:
        return FORMULAS[self.formula][1](self.shape, itemsize(self.dtype), pass_ == "fwd+bwd")


def itemsize(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}[dtype]


def _bench(op: str) -> Any:
    """The bench module of ``op``'s folder (light: no torch until it builds inputs)."""
    return OP_DEFS[op].part("bench")


#: op formula -> (text, function(shape, itemsize, backward) -> bytes or FLOPs). s = bytes per element.
#: Each op's, from its folder.
FORMULAS: dict[str, tuple[str, Callable[[dict, int, bool], float]]] = {
    key: formula for op in OP_DEFS for key, formula in _bench(op).FORMULAS.items()
}

#: The presets every op adds its workloads to (its bench module's ``IN_PRESETS``), in the ops' order.
SHARED: dict[str, str] = {
    "seed": "the seed benchmark: batch 4 x seq 2048 tokens, hidden 2560, intermediate 6912; RoPE 32 q / 8 kv "
            "heads, head dim 128 (partial: 64 rotary channels); bf16",
    "host": "rms_norm, rotary and swiglu at tiny shapes: each kernel takes microseconds, so wall time is the host's "
            "per call (checks, dispatch, autograd, launch); bf16",
    "cpu-small": "every op at small shapes (runs anywhere; the default on the CPU); cross-entropy on peaked logits",
}


def _workload(preset: str, op: str, w: OpWorkload) -> Workload:
    return Workload(preset, op, w.variant, w.dtype, dict(w.shape), w.metric, w.formula or op, w.logits)


def _shared(name: str) -> Callable[[str], list[Workload]]:
    """The shared preset ``name``: every op's workloads in it, in the ops' order."""
    return lambda p: [_workload(p, op, w) for op in OP_DEFS
                      for w in getattr(_bench(op), "IN_PRESETS", {}).get(name, ())]


def _own(op: str, items: Sequence[OpWorkload]) -> Callable[[str], list[Workload]]:
    return lambda p: [_workload(p, op, w) for w in items]


#: preset name -> (description, workloads): the shared presets, then each op's own (from its folder).
PRESETS: dict[str, tuple[str, Callable[[str], list[Workload]]]] = {
    "seed": (SHARED["seed"], _shared("seed")),
    **{name: (desc, _own(op, items))
       for op in OP_DEFS for name, (desc, items) in getattr(_bench(op), "PRESETS", {}).items()},
    **{name: (desc, _shared(name)) for name, desc in SHARED.items() if name != "seed"},
}
GPU_DEFAULT = ("seed", *(name for op in OP_DEFS for name in getattr(_bench(op), "GPU_DEFAULT", ())))
CPU_DEFAULT = ("cpu-small",)


def workloads(presets: Sequence[str], op: str | None = None) -> list[Workload]:
    out = []
    for name in presets:
        if name not in PRESETS:
            raise SystemExit(f"veomni-ops bench: unknown preset {name!r}; presets: {', '.join(PRESETS)}")
        out += [w for w in PRESETS[name][1](name) if op is None or w.op == op]
    return out


#: A workload's inputs by name, and the names of the differentiable ones.
Inputs = tuple[dict[str, Any], tuple[str, ...]]


@dataclass(frozen=True)
class Draws:
    """What an op's ``build_inputs`` draws with: the conformance kit's
    :class:`~veomni_ops.testing.cases.Builder` (seeded; its dtype and device are the workload's),
    a generator on the device, and :meth:`randn`."""

    builder: Any
    generator: Any
    device: Any

    def randn(self, *shape: int, scale: float = 1.0, dtype: Any = None) -> Any:
        """Standard normal draws of ``shape`` times ``scale``, in the workload's dtype (or ``dtype``):
        generated on the device in float32 (float64 on the CPU, as the conformance kit does, is far
        too slow here)."""
        import torch

        t = torch.randn(shape, generator=self.generator, device=self.device, dtype=torch.float32) * scale
        return t.to(dtype or self.builder.dtype)


def build_inputs(w: Workload, device: Any, seed: int = 0) -> Inputs:
    """Inputs for ``w`` in the form the conformance harness calls kernels with (its op folder's
    ``build_inputs``)."""
    import torch

    from ..testing.cases import TORCH_DTYPES, Builder

    if w.op not in OP_DEFS:
        raise ValueError(f"no workload builder for op {w.op!r}")
    dev = torch.device(device)
    draws = Draws(Builder(seed, TORCH_DTYPES[w.dtype], device), torch.Generator(device=dev).manual_seed(seed), dev)
    return _bench(w.op).build_inputs(w, draws)
