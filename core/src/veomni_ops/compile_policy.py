"""What ``auto`` takes in compile mode, from measurements (not from declared priority).

Under ``torch.compile`` the compiler fuses the reference (``eager``) kernels with their
neighbours; an opaque kernel (a Triton launch, a custom op) is a fusion boundary. Where a
committed measurement shows the compiled reference faster than the kernel ``auto`` would
otherwise take, compile-mode ``auto`` binds the reference for that op, and the plan's reason
cites the measurement. Every other op keeps the priority order (among kernels that say
``supports_compile``). A named kernel is never replaced. Each op's folder declares its measured
choices (``OpDef.compile_preferences`` in ``veomni_ops/ops/<op>/__init__.py``); this module reads
them, and says below what they rest on.

Every measurement below was made on one device kind, an H100 (CUDA capability 9.0), so a
preference applies on that capability only (:data:`MEASURED_ON`; an H200 is 9.0 too). On any
other GPU, and where the capability is not known (``--device cuda``), compile-mode ``auto``
keeps the priority order and the plan says that the measurements do not apply there.

Evidence, and how good it is (every figure: ``veomni-ops train``, ``small`` presets, bf16,
batch 4 x 2048, ``train.compile: true``, median tokens/s over steady steps, each run in its own
process):

* ``benchmarks/results/h100-2026-11-24-compile-ablation/`` (torch 2.11, one kernel choice
  changed at a time, one session). Dense: everything ``auto`` 140.6k tok/s; cross-entropy
  ``eager`` (logits) 178.8k; rms_norm, rotary, swiglu also ``eager`` 190.1k (transformers +
  compile in the same session: 190.8k) -- ``qwen3-{A,B,C}.json``. So the compiled reference
  beats our Triton norm/rope/SwiGLU (+6%) and the compiled logits loss beats the ``chunked``
  fused loss (+27%, at +3.7 GiB of peak memory). The MoE column of that table (108.1k -> 124.5k
  -> 142.5k for A -> B -> C) has **no committed file**: the run printed it, its JSON was not
  fetched; only E (experts ``grouped_mm``, 150.1k) and F (aux loss ``eager``, 142.1k) have one,
  so their comparisons with C lean on an unbacked figure. The norm/rope/swiglu and logits-loss
  preferences therefore rest on the dense model's files alone.
* experts, ``benchmarks/results/h100-2026-11-25-step/moe-small.json`` (one run, both jobs):
  ``grouped_mm`` 160.8k tok/s, ``triton`` 156.9k (2.4%) under compile.
* the loss, ``benchmarks/results/h100-2026-11-25-flce/``: veomni-triton's fused linear loss
  against transformers + compile *in the same run*: dense 202.9k vs 191.0k tok/s (1.06x) at
  7.62 vs 12.24 GiB (0.62x); MoE 160.4k vs 144.1k (1.11x) and, a second run, 156.5k vs 145.6k
  (1.07x), at 9.34 vs 13.84 GiB (0.67x). Against the compiled logits loss it displaced there is
  **no same-run pair**: that loss ran on 2026-11-24 (``../h100-2026-11-24-train-compile-policy/``)
  at 1.01x (dense, 191.8k vs 190.4k) and 1.08x (MoE, 154.3k vs 143.4k) of *its* run's
  transformers + compile, at their memory. Ratio to ratio, the fused loss is ~5% faster on the
  dense model, and on the MoE model within the run-to-run spread (1.07x-1.11x against 1.08x):
  what it surely buys there is memory (0.67x). A GPU re-run with both jobs in one call settles
  it (``examples/qwen3*-auto-compile-eager-ce.yaml`` say how).
"""

from __future__ import annotations

from collections.abc import Mapping

# The preference type and the evidence live with the ops' own declarations (each op's folder
# lists its measured choices); named here as they always were.
from .ops import OP_DEFS
from .ops.base import EVIDENCE, FLCE_EVIDENCE, MEASURED_ON, STEP_EVIDENCE, Preference

__all__ = ["COMPILE_PREFERENCES", "EVIDENCE", "FLCE_EVIDENCE", "MEASURED_ON", "STEP_EVIDENCE", "Preference",
           "capability_text", "not_measured_here", "preferences"]

#: (op, device type) -> the kernels and variants compile-mode ``auto`` takes, best first: the
#: first one usable here (a plugin may not be installed). Each op's folder declares its own
#: (``OpDef.compile_preferences``).
COMPILE_PREFERENCES: Mapping[tuple[str, str], tuple[Preference, ...]] = {
    (op, device_type): prefs for op, d in OP_DEFS.items() for device_type, prefs in d.compile_preferences.items()
}


def _measured_here(p: Preference, capability: tuple[int, int] | None) -> bool:
    return capability is not None and tuple(capability) == p.capability


def capability_text(capability: tuple[int, int]) -> str:
    return "sm %d.%d" % capability


def preferences(op: str, variants: tuple[str, ...], device_type: str,
                capability: tuple[int, int] | None = None) -> tuple[Preference, ...]:
    """The measured compile-mode choices for ``op`` among ``variants`` on ``device_type`` at
    ``capability``, best first (resolution takes the first one usable here); empty where nothing
    was measured on that device type and capability (:data:`MEASURED_ON`).

    The offset RMSNorm and partial rotary take the same choice as their standard/full variant."""
    out = []
    for p in COMPILE_PREFERENCES.get((op, device_type), ()):
        if not _measured_here(p, capability):
            continue
        if p.variant in variants:
            out.append(p)
            continue
        same_family = {"standard": "offset", "full": "partial"}.get(p.variant)
        if same_family in variants:
            out.append(Preference(p.kernel, same_family, p.why, p.evidence, p.capability))
    return tuple(out)


def not_measured_here(op: str, device_type: str, capability: tuple[int, int] | None) -> str:
    """What the plan says where ``op`` has compile-mode measurements on ``device_type`` but none
    at ``capability``: they were not applied (the priority order was). Empty otherwise."""
    prefs = COMPILE_PREFERENCES.get((op, device_type), ())
    if not prefs or any(_measured_here(p, capability) for p in prefs):
        return ""
    where = sorted({capability_text(p.capability) for p in prefs})
    here = capability_text(capability) if capability is not None else "an unknown capability"
    return (f"the compile-mode measurements of {op} ({', '.join(where)} only) do not apply on {here}: "
            "priority order")
