"""``OpsConfig``: one string per op, with VeOmni's field names and values.

A VeOmni ``model.ops_implementation`` YAML block, or a plain dict, loads unchanged::

    model:
      ops_implementation:
        attn_implementation: flash_attention_4
        rms_norm_implementation: liger_kernel      # legacy alias of "liger": warns
        moe_implementation: fused_triton           # legacy alias of "triton": warns
        causal_conv1d_implementation: fla          # VeOmni field for an op not managed here: kept, warns

Values are plain strings, so a third-party backend's name is as valid as ours. Every field
defaults to ``auto``: the best kernel usable here, by declared priority (``defaults="veomni"``
fills omitted fields with VeOmni's defaults instead: :meth:`OpsConfig.veomni_defaults`). A whole
VeOmni config loads too: its ``model.ops_implementation`` block, or, without one, every default.

VeOmni values whose kernel depends on the device (``moe_implementation: fused``, VeOmni's GPU
defaults on an Ascend NPU: :data:`veomni_ops.veomni.DEVICE_VALUES`) are kept as written and
resolved for the device a plan is made for (:meth:`OpsConfig.for_device`);
``docs/veomni-values.md`` lists every VeOmni value and what veomni-ops does with it.

Every problem of one config is reported together in one :class:`ConfigError` (unknown
fields and bad values alike). VeOmni fields for ops veomni-ops does not manage
(:data:`UNMANAGED_FIELDS`: Qwen3.5's gated norm, causal conv1d and gated delta rule, ...) are
not errors: they are kept in :attr:`OpsConfig.unmanaged`, reported with an
:class:`UnmanagedFieldWarning`, and those ops run the model's own code.

The field's values, the tables of legacy and unmanaged fields and the config's errors are in
:mod:`~veomni_ops.config_values`, reading a YAML file in :mod:`~veomni_ops.config_files`; this
module re-exports their names.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .config_files import _close_to, _ops_block, load_yaml, not_utf8  # noqa: F401  (re-exported)
from .config_values import (  # noqa: F401  (re-exported)
    _FIELD_ALIASES,
    AUTO,
    LEGACY_NOTES,
    LEGACY_VALUES,
    REMOVED_ENV_VARS,
    SUGGEST_CUTOFF,
    UNMANAGED_FIELDS,
    ConfigError,
    LegacyValueWarning,
    UnmanagedFieldWarning,
    _error,
    _Kept,
    _normalize_value,
    _warn,
    check_removed_env_vars,
    config_error,
    removed_env_var_problems,
)
from .ops import OP_TABLE
from .veomni import DEFAULTS, VEOMNI_DEFAULTS, device_value


@dataclass(frozen=True)
class OpsConfig:
    """Which kernel each op uses. Field names are VeOmni's ``OpsImplementationConfig``.

    ``unmanaged``: VeOmni fields of :data:`UNMANAGED_FIELDS` the config set, as given
    (``(field, value)`` pairs; ``dict(cfg.unmanaged)``). Nothing here applies them.
    """

    attn_implementation: str = AUTO
    rms_norm_implementation: str = AUTO
    rotary_pos_emb_implementation: str = AUTO
    swiglu_mlp_implementation: str = AUTO
    cross_entropy_loss_implementation: str = AUTO
    moe_implementation: str = AUTO
    load_balancing_loss_implementation: str = AUTO
    # veomni-ops' own: VeOmni's OpsImplementationConfig has no router field (veomni.NOT_IN_VEOMNI).
    moe_router_implementation: str = AUTO
    #: not a VeOmni field (VeOmni has no fused residual add + norm): last, after VeOmni's own
    residual_rms_norm_implementation: str = AUTO
    unmanaged: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        values, unmanaged, problems = _check({f: getattr(self, f) for f in FIELD_TO_OP}, self.unmanaged)
        if problems:
            raise _error(problems)
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "unmanaged", unmanaged)

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, *, check_env: bool = True, defaults: str = AUTO) -> OpsConfig:
        """From a plain mapping; also accepts a whole VeOmni config (its ``model.ops_implementation``;
        a whole config without that block is every default).

        ``defaults``: what an omitted field is: ``"auto"`` (ours), or ``"veomni"``: VeOmni's
        default for it (:data:`veomni_ops.veomni.VEOMNI_DEFAULTS`), which then means on each
        device what it means in VeOmni there (GPU defaults rewritten on an Ascend NPU).

        Every problem (unknown fields, bad values) is raised together in one :class:`ConfigError`.
        Fields of :data:`UNMANAGED_FIELDS` are kept in ``unmanaged`` with an :class:`UnmanagedFieldWarning`.
        """
        if defaults not in DEFAULTS:
            raise ConfigError(f"defaults must be one of {', '.join(map(repr, DEFAULTS))}, got {defaults!r}")
        cfg, problems = read_config(data, check_env=check_env, defaults=defaults)
        if problems:
            raise _error(problems)
        return cfg

    @classmethod
    def veomni_defaults(cls, **fields: Any) -> OpsConfig:
        """VeOmni's choices for every field not given (``OpsConfig.veomni_defaults(attn_implementation="sdpa")``):
        :meth:`from_dict` with ``defaults="veomni"``."""
        return cls.from_dict(fields, defaults="veomni")

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, *, defaults: str = AUTO) -> OpsConfig:
        """From a YAML file (a VeOmni config or an ops block). Every problem, a key given twice
        included, is raised together in one :class:`ConfigError` that names the file.
        ``defaults``: as for :meth:`from_dict`."""
        if defaults not in DEFAULTS:
            raise ConfigError(f"defaults must be one of {', '.join(map(repr, DEFAULTS))}, got {defaults!r}")
        cfg, problems = read_config_file(path, defaults=defaults)
        if problems:
            raise _error(problems, os.fspath(path))
        return cfg

    # -- accessors ----------------------------------------------------------------------
    def for_op(self, op: str) -> str:
        return getattr(self, OP_TO_FIELD[op])

    def to_dict(self) -> dict[str, str]:
        """The op fields (``unmanaged`` is not among them)."""
        return {f: getattr(self, f) for f in FIELD_TO_OP}

    def for_device(self, device: Any) -> OpsConfig:
        """This config as it reads on ``device`` (a :class:`~veomni_ops.device.DeviceInfo` or its text,
        ``"npu"``, ``"cuda:9.0"``): every VeOmni value whose kernel depends on the device replaced
        by that kernel (``moe_implementation: fused`` is ``quack`` on CUDA, ``npu`` on an Ascend
        NPU). ``resolve`` plans with it and says in the plan what it replaced."""
        from .device import current_device

        kind = current_device(device).type
        here = {f: device_value(FIELD_TO_OP[f], v, kind)[0] for f, v in self.to_dict().items()}
        changed: dict[str, Any] = {f: v for f, v in here.items() if v != getattr(self, f)}
        return dataclasses.replace(self, **changed) if changed else self


def _fields_in_veomni_order() -> dict[str, str]:
    """config field -> op, in the order of :class:`OpsConfig`'s fields (VeOmni's), from the op
    table (:data:`veomni_ops.ops.OP_TABLE`). An op without its ``OpsConfig`` field, or a field
    without its op, is a mistake in this package: refused at import."""
    op_of = {info.config_field: op for op, info in OP_TABLE.items()}
    declared = [f.name for f in dataclasses.fields(OpsConfig) if f.name != "unmanaged"]
    if set(declared) != set(op_of):
        raise RuntimeError(f"OpsConfig's fields {sorted(declared)} are not the op table's config fields "
                           f"{sorted(op_of)} (veomni_ops.ops.OP_TABLE): add the field to OpsConfig")
    return {name: op_of[name] for name in declared}


#: config field -> op (VeOmni's field order)
FIELD_TO_OP: Mapping[str, str] = _fields_in_veomni_order()


OP_TO_FIELD: Mapping[str, str] = {v: k for k, v in FIELD_TO_OP.items()}


def as_config(config: OpsConfig | Mapping[str, Any] | str | os.PathLike | None) -> OpsConfig:
    """An :class:`OpsConfig` from what ``resolve`` and ``apply`` accept: one, a mapping (a
    plain or whole VeOmni config), a YAML path, or None (every op ``auto``)."""
    if config is None:
        return OpsConfig()
    if isinstance(config, OpsConfig):
        return config
    if isinstance(config, Mapping):
        return OpsConfig.from_dict(config)
    if isinstance(config, (str, os.PathLike)):
        return OpsConfig.from_yaml(config)
    raise TypeError(f"config must be an OpsConfig, a mapping or a YAML path, got {type(config).__name__}")


def read_any(config: OpsConfig | Mapping[str, Any] | str | os.PathLike | None
             ) -> tuple[OpsConfig, tuple[str, ...], str | None]:
    """What :func:`as_config` reads, without raising for the config's own problems: the config
    of every field that has none (the others ``auto``), every problem, and the file it came
    from (None for a mapping). ``veomni_ops.resolve`` resolves the first and reports all."""
    if config is None or isinstance(config, OpsConfig):
        return as_config(config), (), None
    if isinstance(config, Mapping):
        return (*read_config(config), None)
    if isinstance(config, (str, os.PathLike)):
        return (*read_config_file(config), os.fspath(config))
    raise TypeError(f"config must be an OpsConfig, a mapping or a YAML path, got {type(config).__name__}")


def read_config(data: Any, *, check_env: bool = True, defaults: str = AUTO) -> tuple[OpsConfig, tuple[str, ...]]:
    """``OpsConfig.from_dict`` without raising for problems: the config of every field that has
    none (the others left ``auto``) and every problem found. Warns for unmanaged fields only
    when there is no problem (the config is then the one asked for)."""
    problems = removed_env_var_problems() if check_env else []
    block, _ = _ops_block(data, problems)
    known: dict[str, Any] = {}
    unmanaged: dict[str, Any] = {}
    for key, value in block.items():
        if key in FIELD_TO_OP:
            known[key] = value
        elif key in UNMANAGED_FIELDS:
            unmanaged[key] = value
        else:
            problems.append(_unknown_field(key))
    values, kept, value_problems = _check(known, unmanaged)
    problems += value_problems
    if defaults == "veomni":
        # VeOmni's own spellings, kept (no legacy warning: the caller asked for them).
        values.update({f: _Kept(v) for f, v in VEOMNI_DEFAULTS.items() if f not in known})
    if kept and not problems:
        _warn(
            "ops_implementation: veomni-ops does not manage "
            + ", ".join(f"{k}={v!r} ({UNMANAGED_FIELDS[k]})" for k, v in kept)
            + ". Those ops run the model's own code; the values are kept in OpsConfig.unmanaged and not applied.",
            UnmanagedFieldWarning,
        )
    return OpsConfig(**values, unmanaged=kept), tuple(problems)


def read_config_file(path: str | os.PathLike, *, defaults: str = AUTO) -> tuple[OpsConfig, tuple[str, ...]]:
    """``OpsConfig.from_yaml`` without raising for the config's problems (see :func:`read_config`);
    a missing file or one that is not YAML still raises :class:`ConfigError`."""
    try:
        data, problems = load_yaml(path)
    except FileNotFoundError:
        raise ConfigError(f"{os.fspath(path)}: no such file (looked in {os.getcwd()})") from None
    except IsADirectoryError:
        raise ConfigError(f"{os.fspath(path)}: is a directory, not a YAML file") from None
    cfg, more = read_config(data or {}, defaults=defaults)
    return cfg, (*problems, *more)


# ----------------------------------------------------------------------------------------
# Checking
# ----------------------------------------------------------------------------------------


def _check(values: Mapping[str, Any], unmanaged: Any) -> tuple[dict[str, str], tuple[tuple[str, str], ...],
                                                                list[str]]:
    """Normalise the op fields and the unmanaged ones; every problem found, none raised."""
    out: dict[str, str] = {}
    problems: list[str] = []
    for name, value in values.items():
        try:
            out[name] = _normalize_value(name, FIELD_TO_OP[name], value)
        except ConfigError as e:
            problems.append(str(e))
    kept: list[tuple[str, str]] = []
    items = unmanaged.items() if isinstance(unmanaged, Mapping) else unmanaged
    try:
        pairs = [tuple(p) for p in items]
    except TypeError:
        pairs = None
    if pairs is None or any(len(p) != 2 for p in pairs):
        problems.append(f"unmanaged must be a mapping of field: value, got {unmanaged!r}")
        pairs = []
    for key, value in pairs:
        if key not in UNMANAGED_FIELDS:
            problems.append(f"{key!r} is not a field veomni-ops knows as unmanaged; those are: "
                            f"{', '.join(UNMANAGED_FIELDS)}")
        elif value is None:
            continue  # VeOmni's default
        elif not isinstance(value, str) or not value.strip():
            problems.append(f"{key} must be a string (it is not managed by veomni-ops, only kept), got {value!r}")
        else:
            kept.append((key, value.strip()))
    return out, tuple(sorted(kept)), problems


def _stem(name: str) -> str:
    """``rms_norm_implementation`` -> ``rms_norm``; a misspelt or shortened suffix counts too
    (``_impl``, ``_implmentation``)."""
    s = name.strip().lower().replace("-", "_").replace(" ", "_")
    head, sep, last = s.rpartition("_")
    if sep and head and (last.startswith("impl")
                         or difflib.SequenceMatcher(None, last, "implementation").ratio() >= SUGGEST_CUTOFF):
        return head
    return s


def suggest_field(key: Any) -> str | None:
    """The field ``key`` is a close misspelling of, or None. Compares stems (without
    ``_implementation``) and the op names, so that sharing the suffix is not closeness:
    ``rms_norm_impl`` -> ``rms_norm_implementation``, ``foo_implementation`` -> None."""
    if not isinstance(key, str):
        return None
    candidates: dict[str, str] = {}
    for f, op in FIELD_TO_OP.items():
        candidates[_stem(f)] = f
        candidates[op] = f
    for f in UNMANAGED_FIELDS:
        candidates[_stem(f)] = f
    candidates.update(_FIELD_ALIASES)
    stem = _stem(key)
    match = difflib.get_close_matches(stem, list(candidates), n=1, cutoff=SUGGEST_CUTOFF)
    return candidates[match[0]] if match else None


def _unknown_field(key: Any) -> str:
    guess = suggest_field(key)
    if guess is not None:
        return f"unknown ops_implementation field {key!r}; did you mean {guess!r}?"
    return (f"unknown ops_implementation field {key!r}; the fields are: {', '.join(FIELD_TO_OP)} (and, recognised "
            f"but not managed by veomni-ops: {', '.join(UNMANAGED_FIELDS)})")
