"""What a result records about where it ran: the device, library versions, and the
environment variables that change which kernel runs or how it is tuned."""

from __future__ import annotations

import os
import re
from typing import Any

VENDOR_DISTRIBUTIONS = ("liger-kernel", "quack-kernels", "flash-attn", "flash-attn-3", "flash-attn-4",
                        "flash_attn_3", "nvidia-cutlass-dsl", "torch-npu", "triton", "transformers", "torch")


def versions(registry: Any = None) -> dict[str, str]:
    """torch, triton, transformers, every veomni distribution, and every vendor library any
    registered kernel requires (from installed metadata)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    names = set(VENDOR_DISTRIBUTIONS)
    for dist in metadata.distributions():
        n = dist.metadata["Name"] or ""
        if n.lower().startswith("veomni"):
            names.add(n)
    if registry is not None:
        for rk in registry:
            names.add(rk.provenance.distribution)
            for r in rk.spec.requires:
                try:
                    names.add(Requirement(r).name)
                except Exception:
                    pass
    out = {}
    for n in sorted(names, key=str.lower):
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return out


ENV_PREFIXES = ("VEOMNI_OPS_", "LIGER_", "TRITON_", "CUTE_", "QUACK_", "FLASH_", "CUDA_VISIBLE_DEVICES",
                "PYTORCH_CUDA_ALLOC_CONF", "TORCHINDUCTOR_")


def environment() -> dict[str, str]:
    """Environment variables that change which kernel runs or how it is tuned (for example
    ``LIGER_FUSED_MOE_AUTOTUNE=0``): recorded with every result, since they change numbers."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def device_slug(name: str, kind: str) -> str:
    """A short file-name-safe device name: ``h100-sxm``, ``h100-pcie``, ``a100-sxm4-80gb``, ``cpu``."""
    if kind == "cpu":
        return "cpu"
    low = name.lower().replace("nvidia", "").replace("geforce", "").strip()
    m = re.search(r"\b([hb]\d{2,3})\b", low)
    if m and "hbm3" in low and "pcie" not in low:
        return f"{m.group(1)}-sxm"
    for form in ("pcie", "nvl", "sxm"):
        if m and form in low:
            return f"{m.group(1)}-{form}"
    slug = re.sub(r"[^a-z0-9]+", "-", low).strip("-")
    return slug or kind


def device_info() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        cap = torch.cuda.get_device_capability()
        return {"type": "cuda", "name": name, "capability": "%d.%d" % cap, "slug": device_slug(name, "cuda"),
                "torch_device": "cuda"}
    import platform

    cpu = platform.processor() or platform.machine()
    return {"type": "cpu", "name": f"cpu {cpu} ({os.cpu_count()} cores, {torch.get_num_threads()} threads)",
            "capability": None, "slug": "cpu", "torch_device": "cpu"}

