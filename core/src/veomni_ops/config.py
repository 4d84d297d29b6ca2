"""``OpsConfig``: one string per op, with VeOmni's field names and values.

A VeOmni ``model.ops_implementation`` YAML block, or a plain dict, loads unchanged::

    model:
      ops_implementation:
        attn_implementation: flash_attention_4
        rms_norm_implementation: liger_kernel      # legacy alias of "liger": warns
        moe_implementation: fused_triton           # legacy alias of "triton": warns

Values are plain strings, so a third-party backend's name is as valid as ours. Every field
defaults to ``auto``: the best kernel usable here, by declared priority.
"""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from .spec import SpecError, normalize_name

AUTO = "auto"

#: config field -> op
FIELD_TO_OP: Mapping[str, str] = {
    "attn_implementation": "attention",
    "rms_norm_implementation": "rms_norm",
    "rotary_pos_emb_implementation": "rotary",
    "swiglu_mlp_implementation": "swiglu",
    "cross_entropy_loss_implementation": "cross_entropy",
    "moe_implementation": "moe_experts",
    "load_balancing_loss_implementation": "load_balancing_loss",
}
OP_TO_FIELD: Mapping[str, str] = {v: k for k, v in FIELD_TO_OP.items()}

#: Legacy VeOmni values -> current kernel names, per op ("*" = any op). Accepted with a
#: DeprecationWarning that says what to write instead.
LEGACY_VALUES: Mapping[str, Mapping[str, str]] = {
    "*": {"liger_kernel": "liger"},
    "moe_experts": {"fused": "triton", "fused_triton": "triton", "fused_quack": "quack", "fused_npu": "npu"},
    "cross_entropy": {"chunk_loss": "chunked"},
    "attention": {
        "veomni_flash_attention_2_with_sp": "flash_attention_2",
        "veomni_flash_attention_3_with_sp": "flash_attention_3",
        "veomni_flash_attention_4_with_sp": "flash_attention_4",
    },
}

#: Environment variables VeOmni removed; setting one is an error that says what to write.
REMOVED_ENV_VARS: Mapping[str, str] = {
    "VEOMNI_USE_LIGER_KERNEL": (
        "set rms_norm_implementation, rotary_pos_emb_implementation, swiglu_mlp_implementation and "
        "cross_entropy_loss_implementation to 'liger' (or 'eager') in ops_implementation"
    ),
    "USE_GROUP_GEMM": "set moe_implementation: triton (or eager) in ops_implementation",
}


class ConfigError(ValueError):
    """The ops configuration is malformed."""


@dataclass(frozen=True)
class OpsConfig:
    """Which kernel each op uses. Field names are VeOmni's ``OpsImplementationConfig``."""

    attn_implementation: str = AUTO
    rms_norm_implementation: str = AUTO
    rotary_pos_emb_implementation: str = AUTO
    swiglu_mlp_implementation: str = AUTO
    cross_entropy_loss_implementation: str = AUTO
    moe_implementation: str = AUTO
    load_balancing_loss_implementation: str = AUTO

    def __post_init__(self) -> None:
        for f in fields(self):
            op = FIELD_TO_OP[f.name]
            object.__setattr__(self, f.name, _normalize_value(f.name, op, getattr(self, f.name)))

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, *, check_env: bool = True) -> OpsConfig:
        """From a plain mapping; also accepts a whole VeOmni config (``model.ops_implementation``)."""
        if check_env:
            check_removed_env_vars()
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(f"ops_implementation must be a mapping of field: kernel name, got {type(data).__name__}")
        if "model" in data and isinstance(data["model"], Mapping) and "ops_implementation" in data["model"]:
            data = data["model"]["ops_implementation"] or {}
        elif "ops_implementation" in data and isinstance(data["ops_implementation"], Mapping):
            data = data["ops_implementation"]
        known = [f.name for f in fields(cls)]
        bad = []
        for key in data:
            if key not in known:
                guess = difflib.get_close_matches(str(key), known, n=1)
                hint = f"; did you mean {guess[0]!r}?" if guess else f"; the fields are: {', '.join(known)}"
                bad.append(f"unknown ops_implementation field {key!r}{hint}")
        if bad:
            raise ConfigError("\n".join(bad))
        return cls(**dict(data))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> OpsConfig:
        import yaml

        try:
            with open(path) as fh:
                data = yaml.safe_load(fh)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        return cls.from_dict(data or {})

    # -- accessors ----------------------------------------------------------------------
    def for_op(self, op: str) -> str:
        return getattr(self, OP_TO_FIELD[op])

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _normalize_value(field_name: str, op: str, value: Any) -> str:
    if value is None:
        # VeOmni's moe_implementation=None meant "no fused kernel".
        return "eager" if op == "moe_experts" else AUTO
    if not isinstance(value, str):
        raise ConfigError(f"{field_name} must be a string kernel name, got {type(value).__name__} {value!r}")
    if not value.strip():
        raise ConfigError(f"{field_name} is empty; write a kernel name, 'eager' or 'auto'")
    try:
        name = normalize_name(value)
    except SpecError as e:
        raise ConfigError(f"{field_name}: {e}") from None
    for table in (LEGACY_VALUES.get(op, {}), LEGACY_VALUES["*"]):
        if name in table:
            new = table[name]
            warnings.warn(
                f"{field_name}: {value!r} is a legacy VeOmni value; write {field_name}: {new}",
                DeprecationWarning,
                stacklevel=4,
            )
            return new
    return name


def check_removed_env_vars(env: Mapping[str, str] | None = None) -> None:
    env = os.environ if env is None else env
    problems = [f"{k} is set, but it was removed: {fix}" for k, fix in REMOVED_ENV_VARS.items() if k in env]
    if problems:
        raise ConfigError("; ".join(problems) + ". Unset the variable.")
