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
  (no difference: it stays Triton).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

EVIDENCE = "benchmarks/results/h100-2026-11-24-compile-ablation"


@dataclass(frozen=True)
class Preference:
    kernel: str
    variant: str
    why: str


#: (op, device type) -> the kernel and variant compile-mode ``auto`` takes, when usable.
COMPILE_PREFERENCES: Mapping[tuple[str, str], Preference] = {
    ("rms_norm", "cuda"): Preference("eager", "standard", "compiled eager measured faster than triton (+6% step "
                                     "with rotary and swiglu, H100)"),
    ("rotary", "cuda"): Preference("eager", "full", "compiled eager measured faster than triton (H100)"),
    ("swiglu", "cuda"): Preference("eager", "standard", "compiled eager measured faster than triton (H100)"),
    ("moe_experts", "cuda"): Preference("grouped_mm", "standard", "grouped_mm (torch._grouped_mm) measured 5% faster "
                                        "per step than triton under torch.compile (H100, bf16)"),
    ("cross_entropy", "cuda"): Preference("eager", "logits", "compiled logits + cross-entropy measured 27% faster "
                                          "per step than the chunked fused loss (H100; +3.7 GiB peak: name a fused "
                                          "kernel to trade speed for memory)"),
}


def preference(op: str, variants: tuple[str, ...], device_type: str) -> Preference | None:
    """The measured compile-mode choice for ``op`` among ``variants`` on ``device_type``, if any.

    The offset RMSNorm and partial rotary take the same choice as their standard/full variant."""
    p = COMPILE_PREFERENCES.get((op, device_type))
    if p is None:
        return None
    if p.variant in variants:
        return p
    same_family = {"standard": "offset", "full": "partial"}.get(p.variant)
    if same_family in variants:
        return Preference(p.kernel, same_family, p.why)
    return None
