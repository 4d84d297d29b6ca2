"""What a field of :class:`~veomni_ops.config.OpsConfig` may hold, and how a config's problems
are said: the VeOmni fields not managed here, legacy values and what they map to, removed
environment variables, a value normalised (legacy names mapped, device-dependent ones kept as
written), and the errors and warnings of a config."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from types import FrameType
from typing import Any

from .ops import OP_DEFS
from .spec import QUALIFIER, SpecError, normalize_name, split_name
from .veomni import legacy_note

AUTO = "auto"


#: Fields of VeOmni's ``OpsImplementationConfig`` for ops veomni-ops does not manage -> what
#: the op is. A config may carry them (VeOmni's Qwen3.5 configs do): they are recognised, not
#: unknown-field errors; their values are kept as given in ``OpsConfig.unmanaged`` and applied
#: by nobody here (the model's own code runs those ops), and loading a config that sets one
#: warns with :class:`UnmanagedFieldWarning`. ``veomni-ops resolve`` lists them under the plan.
UNMANAGED_FIELDS: Mapping[str, str] = {
    "rms_norm_gated_implementation": "gated RMSNorm of Qwen3.5's GatedDeltaNet",
    "causal_conv1d_implementation": "causal conv1d of Qwen3.5's GatedDeltaNet",
    "chunk_gated_delta_rule_implementation": "chunked gated delta rule of Qwen3.5's GatedDeltaNet",
    "rotary_pos_emb_vision_implementation": "rotary embedding of vision towers",
    "dsa_indexer_implementation": "DeepSeek sparse-attention indexer",
    "dsa_attention_implementation": "DeepSeek sparse attention",
    "mhc_implementation": "DeepSeek-V4 manifold-constrained hyper-connections",
    "qat_implementation": "DeepSeek-V4 quantization-aware training recipe",
}


#: Legacy VeOmni values -> current kernel names, per op ("*" = any op). Accepted with a
#: :class:`LegacyValueWarning` (a DeprecationWarning) that says what to write instead; a
#: qualified legacy name maps too (``liger_kernel@veomni-liger`` -> ``liger@veomni-liger``).
#: A legacy value whose kernel depends on the device (:data:`veomni_ops.veomni.DEVICE_VALUES`:
#: ``fused``, ``fused_triton``, ``liger_kernel`` for the four ops VeOmni defaults to it, ``npu``
#: for the loss) is kept as written, warned about with what it is per device, and resolved per
#: device; qualified, it maps here (a distribution named is VeOmni's rewrite opted out of).
LEGACY_VALUES: Mapping[str, Mapping[str, str]] = {
    "*": {"liger_kernel": "liger"},
    **{op: d.legacy for op, d in OP_DEFS.items() if d.legacy},  # each op's own, from its folder
}


#: What a legacy value meant beyond the kernel it maps to: said in its warning (each op's, from its folder).
LEGACY_NOTES: Mapping[str, str] = {value: note for d in OP_DEFS.values() for value, note in d.legacy_notes.items()}


#: Environment variables VeOmni removed; setting one is an error that says what to write.
REMOVED_ENV_VARS: Mapping[str, str] = {
    "VEOMNI_USE_LIGER_KERNEL": (
        "set rms_norm_implementation, rotary_pos_emb_implementation, swiglu_mlp_implementation and "
        "cross_entropy_loss_implementation to 'liger' (or 'eager') in ops_implementation"
    ),
    "USE_GROUP_GEMM": "set moe_implementation: triton (or eager) in ops_implementation",
}


#: Field-name spellings people write for an op, beyond the fields' own stems and the op names.
_FIELD_ALIASES: Mapping[str, str] = {"rope": "rotary_pos_emb_implementation", "mlp": "swiglu_mlp_implementation"}


#: How close a misspelt field's stem must be to a field's for "did you mean" (difflib ratio).
SUGGEST_CUTOFF = 0.8


class _Kept(str):
    """A VeOmni value kept as written (its kernel depends on the device), already warned about:
    constructing a config from it again (``dataclasses.replace``, :meth:`OpsConfig.for_device`,
    VeOmni's defaults) does not warn again. Equal to the plain string."""

    __slots__ = ()


class ConfigError(ValueError):
    """The ops configuration is malformed. ``problems`` lists every problem found; where the rest
    of the config was resolved too (``veomni_ops.resolve`` of a mapping or a file), ``problems``
    ends with the resolution's refusals, which ``refusals`` holds as well."""

    def __init__(self, message: str, problems: Iterable[str] | None = None, refusals: Iterable[Any] = ()):
        super().__init__(message)
        self.problems: tuple[str, ...] = tuple(problems) if problems is not None else (message,)
        self.refusals: tuple[Any, ...] = tuple(refusals)


class LegacyValueWarning(DeprecationWarning):
    """A legacy VeOmni value was mapped to today's name; the message says what to write."""


class UnmanagedFieldWarning(UserWarning):
    """The config sets VeOmni fields for ops veomni-ops does not manage (:data:`UNMANAGED_FIELDS`)."""


def _error(problems: Sequence[str], where: str | None = None, refusals: Sequence[Any] = (),
           device: Any = None) -> ConfigError:
    """One :class:`ConfigError` for every problem of a config (of the file ``where``, if any),
    ``refusals`` the resolution's of its other fields (their descriptions end ``problems``)."""
    problems = [*problems, *(r.describe() for r in refusals)]
    if len(problems) == 1:
        return ConfigError(f"{problems[0]} (in {where})" if where else problems[0], problems, refusals)
    head = f"{len(problems)} problems in ops_implementation"
    if refusals:
        head += f" ({len(refusals)} of them resolving its other fields for device {device})"
    message = f"{head}:\n" + "\n".join(f"  - {p}" for p in problems)
    return ConfigError(f"{where}: {message}" if where else message, problems, refusals)


def config_error(problems: Sequence[str], where: str | None = None, refusals: Sequence[Any] = (),
                 device: Any = None) -> ConfigError:
    """The :class:`ConfigError` ``veomni_ops.resolve`` raises for a config with problems: the
    config's own and the refusals of resolving the rest, in one message."""
    return _error(problems, where, refusals, device)


def _normalize_value(field_name: str, op: str, value: Any) -> str:
    if isinstance(value, _Kept):
        return value
    if value is None:
        # VeOmni's moe_implementation=None meant "no fused kernel".
        return "eager" if op == "moe_experts" else AUTO
    if not isinstance(value, str):
        raise ConfigError(f"{field_name} must be a string kernel name, got {type(value).__name__} {value!r}")
    if not value.strip():
        raise ConfigError(f"{field_name} is empty; write a kernel name, 'eager' or 'auto'")
    try:
        kernel, dist = split_name(value)
    except SpecError as e:
        raise ConfigError(f"{field_name}: {e}") from None
    name = normalize_name(value)
    per_device = legacy_note(op, kernel, field_name) if dist is None else None
    if per_device is not None:
        # Kept as written: which kernel it is depends on the device (resolve says which, per device).
        _warn(f"{field_name}: {value!r} is a legacy VeOmni value; {per_device}", LegacyValueWarning)
        return _Kept(name)
    for table in (LEGACY_VALUES.get(op, {}), LEGACY_VALUES["*"]):
        if kernel in table:
            new = table[kernel] + (f"{QUALIFIER}{dist}" if dist else "")
            note = f" ({LEGACY_NOTES[kernel]})" if kernel in LEGACY_NOTES else ""
            _warn(f"{field_name}: {value!r} is a legacy VeOmni value; write {field_name}: {new}{note}", LegacyValueWarning)
            return new
    return name


def _warn(message: str, category: type[Warning]) -> None:
    """Warn, attributed to the first caller outside veomni-ops (the user's line), however deep
    in the package the config was read (``OpsConfig(...)``, ``from_yaml``, ``resolve``, ``apply``)."""
    level = 1
    frame: FrameType | None = sys._getframe(0)
    while frame is not None and str(frame.f_globals.get("__name__", "")).partition(".")[0] == "veomni_ops":
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


def removed_env_var_problems(env: Mapping[str, str] | None = None) -> list[str]:
    """One problem per removed environment variable that is set (:data:`REMOVED_ENV_VARS`)."""
    env = os.environ if env is None else env
    return [f"{k} is set, but it was removed: {fix}. Unset the variable." for k, fix in REMOVED_ENV_VARS.items()
            if k in env]


def check_removed_env_vars(env: Mapping[str, str] | None = None) -> None:
    problems = removed_env_var_problems(env)
    if problems:
        raise _error(problems)
