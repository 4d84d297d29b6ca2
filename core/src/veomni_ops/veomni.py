"""What VeOmni's own config values mean, where veomni-ops reads them differently.

VeOmni (``ByteDance-Seed/VeOmni`` at commit d977449, ``veomni/arguments/arguments_types.py``)
picks some kernels by device, and its defaults are concrete kernels where ours are ``auto``.
``docs/veomni-values.md`` lists every value VeOmni accepts, with its file and line, and what
veomni-ops does with it. This module holds the three tables that behaviour needs:

* :data:`DEVICE_VALUES`: VeOmni values whose kernel depends on the device. A config keeps the
  value as written; :func:`device_value` (called by ``resolve`` for the device it plans for)
  says which kernel it is there. On an Ascend NPU VeOmni rewrites every field still at its GPU
  default (``liger_kernel``, ``fused_triton``, ``triton``), and ``moe_implementation: fused`` is
  Quack's MoE off NPU and the NPU kernel on one; ``flash_attention_2/3/4`` are veomni-flash's
  kernels off an NPU and veomni-npu's ``npu_fusion_attention`` kernel on one.
* :data:`VEOMNI_DEFAULTS`: VeOmni's default for each managed field, for
  ``OpsConfig.from_dict(..., defaults="veomni")`` / ``OpsConfig.veomni_defaults()`` /
  ``veomni-ops resolve --defaults veomni``.
* :data:`NOT_PROVIDED`: VeOmni kernels veomni-ops has no kernel for. Where no installed plugin
  provides the name, the refusal says what VeOmni's kernel is, what it needs and what to write.

Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: Where VeOmni's config class lives (the file the ``arguments_types.py:N`` references below name).
SOURCE = "VeOmni d977449, veomni/arguments/arguments_types.py"


@dataclass(frozen=True)
class DeviceChoice:
    """The kernel a VeOmni value stands for: ``npu`` on an Ascend NPU, ``other`` on every other
    device (``None``: VeOmni refuses it there, and so does veomni-ops). ``why`` is VeOmni's rule,
    with its source. ``legacy``: a VeOmni spelling veomni-ops does not use (its loading warns)."""

    npu: str
    other: str | None
    why: str
    legacy: bool = True

    def on(self, device_type: str) -> str | None:
        return self.npu if device_type == "npu" else self.other


def _gpu_default(npu: str, other: str, line: int, legacy: bool = True) -> DeviceChoice:
    return DeviceChoice(npu, other, f"VeOmni's GPU default, which VeOmni rewrites to {npu!r} on an Ascend NPU "
                                    f"({SOURCE}:{line}, _NPU_DEFAULT_FALLBACK)", legacy)


#: op -> VeOmni value -> :class:`DeviceChoice`. The values are normalised kernel names.
DEVICE_VALUES: Mapping[str, Mapping[str, DeviceChoice]] = {
    "rms_norm": {"liger_kernel": _gpu_default("npu", "liger", 980)},
    "rotary": {"liger_kernel": _gpu_default("npu", "liger", 981)},
    # VeOmni has no NPU SwiGLU and runs eager there (veomni-npu's npu kernel is taken only by name or auto).
    "swiglu": {"liger_kernel": _gpu_default("eager", "liger", 983)},
    # VeOmni's 'npu' cross-entropy is its chunk_loss (veomni/ops/kernels/cross_entropy/__init__.py:487-506),
    # which is the core's chunked kernel.
    "cross_entropy": {
        "liger_kernel": _gpu_default("chunked", "liger", 985),
        "npu": DeviceChoice("chunked", None, "VeOmni's chunk_loss behind a torch_npu check: it requires an Ascend NPU "
                                             f"({SOURCE}:975, _NPU_REQUIRED; veomni/ops/kernels/cross_entropy/"
                                             "__init__.py:500)"),
    },
    "moe_experts": {
        "fused_triton": _gpu_default("npu", "triton", 986),
        "fused": DeviceChoice("npu", "quack", "VeOmni's deprecated alias: fused_npu on an Ascend NPU, fused_quack "
                                              f"elsewhere ({SOURCE}:1161-1169)"),
    },
    "load_balancing_loss": {"triton": _gpu_default("eager", "triton", 984, legacy=False)},
    # On an Ascend NPU VeOmni's flash attention (veomni/ops/kernels/attention/flash.py:21,278) is
    # transformers' _flash_attention_forward, which there takes the NPU functions for every flash
    # implementation (transformers/modeling_flash_attention_utils.py, _lazy_imports): veomni-npu's 'npu'.
    "attention": {
        f"flash_attention_{v}": DeviceChoice(
            "npu", f"flash_attention_{v}",
            "VeOmni's flash attention, which on an Ascend NPU runs transformers' NPU flash attention "
            "(transformers.integrations.npu_flash_attention: torch_npu.npu_fusion_attention; VeOmni d977449, "
            "veomni/ops/kernels/attention/flash.py:21,278)",
            legacy=False,
        )
        for v in (2, 3, 4)
    },
}

#: VeOmni's defaults for omitted fields (``OpsImplementationConfig``, {SOURCE}:1025-1090).
VEOMNI_DEFAULTS: Mapping[str, str] = {
    "attn_implementation": "flash_attention_2",
    "moe_implementation": "fused_triton",
    "cross_entropy_loss_implementation": "liger_kernel",
    "rms_norm_implementation": "liger_kernel",
    "swiglu_mlp_implementation": "liger_kernel",
    "rotary_pos_emb_implementation": "liger_kernel",
    "load_balancing_loss_implementation": "triton",
}

#: The ways a config may fill omitted fields: ``auto`` (ours) or ``veomni`` (VeOmni's defaults).
DEFAULTS = ("auto", "veomni")


@dataclass(frozen=True)
class NotProvided:
    """A VeOmni kernel veomni-ops does not provide: what it is in VeOmni (with its source), what
    it needs, and what to write instead. ``device``: only on this device type (``None``: anywhere)."""

    kernel: str
    needs: str
    instead: str
    device: str | None = None

    def describe(self) -> str:
        return (f"In VeOmni this is {self.kernel}; it needs {self.needs}. veomni-ops provides no such kernel: "
                f"write {self.instead}.")


_MAGI = NotProvided(
    "MagiAttention's FFA kernels (veomni/ops/kernels/attention/magi/, registered at "
    "veomni/ops/kernels/attention/__init__.py:89)",
    "the magi-attention 1.1.1 package, an NVIDIA GPU of sm 9.0 or newer, a MagiAttentionMask built by the model, "
    "batch size 1, context-parallel size 1 and no attention dropout (veomni/ops/kernels/attention/magi/"
    "__init__.py:95-112)",
    "attn_implementation: flash_attention_3 (Hopper) or flash_attention_4 (sm 9.0+), flex_attention for a custom "
    "mask on CUDA, or auto",
)

#: op -> VeOmni value (normalised) -> :class:`NotProvided`.
NOT_PROVIDED: Mapping[str, Mapping[str, NotProvided]] = {
    "attention": {
        "magi_attention": _MAGI,
        "veomni_magi_attention_with_sp": _MAGI,
        "native_sparse": NotProvided(
            f"a value its config type lists ({SOURCE}:1034) but no kernel behind it: VeOmni registers none under "
            "that name, and hands it to transformers as attn_implementation, which has no 'native-sparse' either",
            "a kernel nobody ships",
            "attn_implementation: sdpa, a flash kernel, or auto",
        ),
    },
    "moe_experts": {
        # veomni 0.1.12 on the package index (newer than d977449) adds Cambricon MLU kernels.
        name: NotProvided(
            f"the Cambricon MLU experts kernel {name!r} of veomni 0.1.12 (MLU group GEMM)",
            "torch_mlu on a Cambricon MLU (a device veomni-ops does not know)",
            "moe_implementation: triton, quack or grouped_mm on CUDA, npu on Ascend, eager, or auto",
        )
        for name in ("fused_mlu", "fused_mlu_triton")
    },
}


def device_value(op: str, value: str, device_type: str) -> tuple[str, str | None]:
    """The kernel name ``value`` (a config value for ``op``) stands for on ``device_type``, and
    why, when that is not ``value`` itself: ``("npu", "which is npu on npu: VeOmni's GPU default, ...")``.
    Where VeOmni refuses the value on that device the name stays and the note says so."""
    choice = DEVICE_VALUES.get(op, {}).get(value)
    if choice is None:
        return value, None
    kernel = choice.on(device_type)
    if kernel is None:
        return value, f"{value!r} is {choice.why}; off an NPU VeOmni refuses it, and so does veomni-ops"
    if kernel == value:
        return value, None
    return kernel, f"which is {kernel} on {device_type}: {choice.why}"


def off_device_fix(op: str, value: str, field: str, device_type: str) -> str | None:
    """What to write instead of a VeOmni value that VeOmni (and veomni-ops) refuses on ``device_type``."""
    choice = DEVICE_VALUES.get(op, {}).get(value)
    if choice is None or choice.on(device_type) is not None:
        return None
    return f"Write {field}: {choice.npu}, the kernel it is on an Ascend NPU (it runs on {device_type} too)."


def not_provided(op: str, value: str, device_type: str) -> NotProvided | None:
    """What VeOmni's ``value`` for ``op`` is, if veomni-ops provides no kernel for it on ``device_type``."""
    entry = NOT_PROVIDED.get(op, {}).get(value)
    if entry is None or (entry.device is not None and entry.device != device_type):
        return None
    return entry


def legacy_note(op: str, value: str, field: str) -> str | None:
    """For a legacy VeOmni value whose kernel depends on the device: what to write, per device."""
    choice = DEVICE_VALUES.get(op, {}).get(value)
    if choice is None or not choice.legacy:
        return None
    if choice.other is None:
        return (f"write {field}: {choice.npu} (it is {choice.why}; off an NPU VeOmni refuses it, and so does "
                "veomni-ops)")
    return f"write {field}: {choice.other} (or {choice.npu} on an Ascend NPU): it is {choice.why}"
