"""veomni-ops: kernel selection for LLM training, with backends as plugins.

    from veomni_ops import OpsConfig, Target, Mode, resolve, apply
    plan = resolve(OpsConfig(rms_norm_implementation="liger"))       # for this machine, training, eager
    plan = resolve(OpsConfig(), Target("cuda:9.0", dtype="bfloat16", mode=Mode.TRAINING | Mode.COMPILE))
    print(plan.table())
    apply(model, plan)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import ConfigError, OpsConfig
from .device import DeviceInfo, current_device, parse_device
from .discovery import PluginLoadError, build_registry, core_version, discover
from .hookspecs import PLUGIN_API_VERSION, hookimpl, hookspec
from .plan import KernelPlan, PlanEntry
from .registry import ContestedNameError, DuplicateKernelError, LoadFailure, Registry
from .resolve import ResolutionError, resolve
from .spec import OPS, HardwareRequirement, KernelSpec, SpecError, Tolerance
from .target import MemoryBudget, Mode, Need, Target

__all__ = [
    "OPS",
    "PLUGIN_API_VERSION",
    "ConfigError",
    "ContestedNameError",
    "DeviceInfo",
    "DuplicateKernelError",
    "HardwareRequirement",
    "KernelPlan",
    "KernelSpec",
    "LoadFailure",
    "MemoryBudget",
    "Mode",
    "Need",
    "OpsConfig",
    "PlanEntry",
    "PluginLoadError",
    "Registry",
    "ResolutionError",
    "SpecError",
    "Target",
    "Tolerance",
    "apply",
    "build_registry",
    "compile_layers",
    "current_device",
    "discover",
    "hookimpl",
    "hookspec",
    "parse_device",
    "resolve",
]

if TYPE_CHECKING:
    from .binding import apply
    from .parallel.fsdp import compile_layers


def __getattr__(name: str) -> Any:
    # Binding imports torch and transformers: only when used.
    if name == "apply":
        from .binding import apply

        return apply
    # torch.compile each decoder layer in place (compile mode's way to compile a bound model): imports torch.
    if name == "compile_layers":
        from .parallel.fsdp import compile_layers

        return compile_layers
    # The installed distribution's version (core/pyproject.toml), read when asked for.
    if name == "__version__":
        return core_version()
    raise AttributeError(f"module 'veomni_ops' has no attribute {name!r}")
