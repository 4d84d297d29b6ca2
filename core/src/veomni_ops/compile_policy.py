"""What ``auto`` takes in compile mode, from measurements (not from declared priority).

Under ``torch.compile`` the compiler fuses the reference (``eager``) kernels with their
neighbours; an opaque kernel (a Triton launch, a custom op) is a fusion boundary. Where a
committed measurement shows the compiled reference faster than the kernel ``auto`` would
otherwise take, compile-mode ``auto`` binds the reference for that op and device type, and
the plan's reason cites the measurement. Every other op keeps the priority order (among
kernels that say ``supports_compile``). A named kernel is never replaced.

Evidence: ``benchmarks/results/h100-2026-11-24-compile-ablation/`` (H100, torch 2.11,
``veomni-ops train`` on the ``small`` Qwen3 / Qwen3-MoE presets, bf16, batch 4 × 2048,
``train.compile: true``, median tokens/s over steady steps):

* dense, everything ``auto``: 140.6k tok/s; cross-entropy ``eager`` (logits): 178.8k;
  rms_norm, rotary, swiglu also ``eager``: 190.1k (transformers + compile in the same
  session: 190.8k). So the compiled reference beats our Triton norm/rope/SwiGLU (+6%) and the
  compiled logits loss beats the ``chunked`` fused loss (+27%, at +3.7 GiB of peak memory).
* MoE: 108.1k -> 124.5k (CE eager) -> 142.5k (norm/rope eager too), the experts and the aux
  loss still Triton; with the experts on ``grouped_mm`` (``torch._grouped_mm``, which the
  compiler sees as one op) instead: 150.1k; the aux loss ``eager`` instead of Triton: 142.1k
  (no difference: it stays Triton). Rerun after both expert kernels got faster
  (``benchmarks/results/h100-2026-11-25-step/``): experts ``grouped_mm`` 160.8k tok/s, ``triton`` 156.9k.
* cross-entropy, ``benchmarks/results/h100-2026-11-25-flce/``: with veomni-triton's fused linear
  loss named, compile mode ran at 202.9k tok/s, 7.62 GiB (dense) and 160.4k, 9.34 GiB (MoE)
  against transformers + compile's 191.0k, 12.24 GiB and 144.1k, 13.84 GiB in the same runs
  (the compiled logits loss that ``auto`` took before: 191.8k / 154.3k at the baseline's memory,
  2026-11-24). So compile-mode ``auto`` takes it first where veomni-triton is installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

EVIDENCE = "benchmarks/results/h100-2026-11-24-compile-ablation"
#: The fused linear cross-entropy under compile (issue 13's kernel beside transformers + compile).
FLCE_EVIDENCE = "benchmarks/results/h100-2026-11-25-flce"
#: The whole step after the MoE kernels' speed-ups (experts grouped_mm vs triton under compile).
STEP_EVIDENCE = "benchmarks/results/h100-2026-11-25-step"


@dataclass(frozen=True)
class Preference:
    kernel: str
    variant: str
    why: str
    evidence: str = EVIDENCE


#: (op, device type) -> the kernels and variants compile-mode ``auto`` takes, best first: the
#: first one usable here (a plugin may not be installed).
COMPILE_PREFERENCES: Mapping[tuple[str, str], tuple[Preference, ...]] = {
    ("rms_norm", "cuda"): (Preference("eager", "standard", "compiled eager measured faster than triton (+6% step "
                                      "with rotary and swiglu, H100)"),),
    ("rotary", "cuda"): (Preference("eager", "full", "compiled eager measured faster than triton (H100)"),),
    ("swiglu", "cuda"): (Preference("eager", "standard", "compiled eager measured faster than triton (H100)"),),
    ("moe_experts", "cuda"): (Preference("grouped_mm", "standard", "grouped_mm (torch._grouped_mm) measured faster "
                                         "per step than triton under torch.compile (H100, bf16, MoE small: 2.4% "
                                         "after both kernels' speed-ups)", STEP_EVIDENCE),),
    ("cross_entropy", "cuda"): (
        Preference("triton", "fused_linear", "veomni-triton's fused linear loss measured faster than the compiled "
                   "logits loss, at less memory (H100, whole step vs transformers + compile: dense 1.06x at 0.62x "
                   "memory, MoE 1.11x at 0.67x)", FLCE_EVIDENCE),
        Preference("eager", "logits", "compiled logits + cross-entropy measured 27% faster per step than the chunked "
                   "fused loss (H100; +3.7 GiB peak: name a fused kernel to trade speed for memory)"),
    ),
}


def preferences(op: str, variants: tuple[str, ...], device_type: str) -> tuple[Preference, ...]:
    """The measured compile-mode choices for ``op`` among ``variants`` on ``device_type``, best
    first (resolution takes the first one usable here); empty where nothing was measured.

    The offset RMSNorm and partial rotary take the same choice as their standard/full variant."""
    out = []
    for p in COMPILE_PREFERENCES.get((op, device_type), ()):
        if p.variant in variants:
            out.append(p)
            continue
        same_family = {"standard": "offset", "full": "partial"}.get(p.variant)
        if same_family in variants:
            out.append(Preference(p.kernel, same_family, p.why, p.evidence))
    return tuple(out)

