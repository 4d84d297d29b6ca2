"""What VeOmni's own config values mean, where veomni-ops reads them differently.

VeOmni (``ByteDance-Seed/VeOmni`` at commit d977449, ``veomni/arguments/arguments_types.py``)
picks some kernels by device, and its defaults are concrete kernels where ours are ``auto``.
``docs/veomni-values.md`` lists every value VeOmni accepts, with its file and line, and what
veomni-ops does with it. This module holds the tables that behaviour needs (the first and
the last gathered from the op folders, where each op declares its own: ``OpDef.veomni_values``,
``OpDef.veomni_not_provided``):

* :data:`DEVICE_VALUES`: VeOmni values whose kernel depends on the device. A config keeps the
  value as written; :func:`device_value` (called by ``resolve`` for the device it plans for)
  says which kernel it is there. On an Ascend NPU VeOmni rewrites every field still at its GPU
  default (``liger_kernel``, ``fused_triton``, ``triton``), and ``moe_implementation: fused`` is
  Quack's MoE off NPU and the NPU kernel on one; ``flash_attention_2/3/4`` are veomni-flash's
  kernels off an NPU and veomni-npu's ``npu_fusion_attention`` kernel on one.
* :data:`VEOMNI_DEFAULTS`: VeOmni's default for each managed field (for a field VeOmni lacks,
  :data:`NOT_IN_VEOMNI`, what VeOmni runs there), for
  ``OpsConfig.from_dict(..., defaults="veomni")`` / ``OpsConfig.veomni_defaults()`` /
  ``veomni-ops resolve --defaults veomni``.
* :data:`NOT_PROVIDED`: VeOmni kernels veomni-ops has no kernel for. Where no installed plugin
  provides the name, the refusal says what VeOmni's kernel is, what it needs and what to write.

Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping

from .ops import OP_DEFS
from .ops.base import VEOMNI_SOURCE, DeviceChoice, NotProvided

#: Where VeOmni's config class lives (the file the ``arguments_types.py:N`` references name).
SOURCE = VEOMNI_SOURCE

#: op -> VeOmni value -> :class:`DeviceChoice`, as each op's folder declares it (``OpDef.veomni_values``).
#: The values are normalised kernel names.
DEVICE_VALUES: Mapping[str, Mapping[str, DeviceChoice]] = {
    op: d.veomni_values for op, d in OP_DEFS.items() if d.veomni_values
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
    # Not VeOmni fields (NOT_IN_VEOMNI): VeOmni runs the model's own code there, which is eager here.
    "moe_router_implementation": "eager",
    "residual_rms_norm_implementation": "eager",
}

#: veomni-ops fields VeOmni's ``OpsImplementationConfig`` has no field for -> what VeOmni runs
#: there. ``defaults="veomni"`` fills them with that (:data:`VEOMNI_DEFAULTS`); a VeOmni config
#: never sets them, and VeOmni itself would refuse them as unknown.
NOT_IN_VEOMNI: Mapping[str, str] = {
    "moe_router_implementation": "VeOmni has no router field: it runs the model's own router code (transformers' "
                                 "Qwen3MoeTopKRouter.forward), which is the eager kernel here",
    "residual_rms_norm_implementation": "VeOmni has no fused residual add + norm field: it runs the decoder layer's "
                                        "own add and post-attention norm, which is the eager kernel here",
}

#: The ways a config may fill omitted fields: ``auto`` (ours) or ``veomni`` (VeOmni's defaults).
DEFAULTS = ("auto", "veomni")


#: op -> VeOmni value (normalised) -> :class:`NotProvided`, as each op's folder declares it
#: (``OpDef.veomni_not_provided``).
NOT_PROVIDED: Mapping[str, Mapping[str, NotProvided]] = {
    op: d.veomni_not_provided for op, d in OP_DEFS.items() if d.veomni_not_provided
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
