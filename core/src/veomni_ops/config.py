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
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from .ops import OP_DEFS, OP_TABLE
from .spec import QUALIFIER, SpecError, normalize_name, split_name
from .veomni import DEFAULTS, VEOMNI_DEFAULTS, device_value, legacy_note

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
        """The seven op fields (``unmanaged`` is not among them)."""
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


def _ops_block(data: Any, problems: list[str]) -> tuple[Mapping[str, Any], str]:
    """The ops block of ``data`` (a plain block, ``{ops_implementation: ...}`` or a whole VeOmni
    config, ``{model: {ops_implementation: ...}}``) and where it is, for messages. A VeOmni
    config whose ``model:`` has no ops block is all defaults. A misspelt section (``modle:``,
    ``ops_implementaton:``) is a problem that names it, and the block in it is still checked."""
    where = "ops_implementation"
    if data is None:
        return {}, where
    if not isinstance(data, Mapping):
        problems.append(f"ops_implementation must be a mapping of field: kernel name, got {type(data).__name__}")
        return {}, where
    block: Any = data
    whole = "model" in data and (data["model"] is None or isinstance(data["model"], Mapping))
    model_key = "model" if whole else _close_to(data, "model")
    if model_key is not None:  # a whole VeOmni config
        if model_key != "model":
            problems.append(f"{model_key!r}: unknown section; did you mean 'model'?")
        model = data[model_key] or {}  # an empty model: section is every default
        where = "model.ops_implementation"
        ops_key = "ops_implementation" if "ops_implementation" in model else _close_to(model, "ops_implementation")
        if ops_key is None:
            return {}, where  # VeOmni's model section without an ops block: every op auto
        if ops_key != "ops_implementation":
            problems.append(f"model.{ops_key}: unknown section; did you mean model.ops_implementation?")
        block = model[ops_key]
    else:
        ops_key = ("ops_implementation" if isinstance(data.get("ops_implementation"), Mapping)
                   else _close_to(data, "ops_implementation"))
        if ops_key is not None:
            if ops_key != "ops_implementation":
                problems.append(f"{ops_key!r}: unknown section; did you mean 'ops_implementation'?")
            block = data[ops_key]
    if block is None:
        return {}, where
    if not isinstance(block, Mapping):
        problems.append(f"{where} must be a mapping of field: kernel name, got {type(block).__name__}")
        return {}, where
    return block, where


def _close_to(mapping: Mapping[str, Any], name: str) -> str | None:
    """The key of ``mapping`` that is a misspelling of section ``name`` and holds a mapping, or None."""
    keys = [k for k, v in mapping.items() if isinstance(k, str) and isinstance(v, Mapping)]
    match = difflib.get_close_matches(name, keys, n=1, cutoff=SUGGEST_CUTOFF)
    return match[0] if match else None


def load_yaml(path: str | os.PathLike) -> tuple[Any, list[str]]:
    """The YAML document at ``path``, and its problems: each key given twice in one mapping, in
    block or flow style (YAML would keep the last value silently), named with both places. A
    file that is not YAML, or not UTF-8 text, raises :class:`ConfigError`; a missing one,
    ``FileNotFoundError``."""
    import yaml

    duplicates: list[str] = []

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            mark = key_node.start_mark
            try:
                first = seen.setdefault(key, mark)
            except TypeError:  # an unhashable key: PyYAML refuses it below
                continue
            if first is not mark:
                # Both on one line ({steps: 2, steps: 1}, flow style): the columns tell them apart.
                where = (f"on lines {first.line + 1} and {mark.line + 1}" if first.line != mark.line else
                         f"on line {mark.line + 1} (columns {first.column + 1} and {mark.column + 1})")
                duplicates.append(f"{os.fspath(path)}:{mark.line + 1}: key {key!r} is given twice, {where} (YAML "
                                  "would keep the second silently): keep one")
        return loader.construct_mapping(node, deep=True)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    # Bytes, not text: PyYAML then reads UTF-8 (or UTF-16 with its BOM) whatever the locale, and
    # a byte it cannot decode is a ReaderError with its offset, said below with the file's name.
    with open(path, "rb") as fh:
        try:
            data = yaml.load(fh, Loader=Loader)  # a SafeLoader: no arbitrary objects
        except yaml.reader.ReaderError as e:
            if e.encoding == "unicode":  # a character YAML does not allow (NUL, ...): PyYAML's words say it
                raise ConfigError(f"{os.fspath(path)}: not valid YAML: {e}") from None
            raise ConfigError(f"{os.fspath(path)}: {not_utf8(path, e.position, e.encoding, e.reason)}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{os.fspath(path)}: not valid YAML: {e}") from None
    return data, duplicates


def not_utf8(path: str | os.PathLike, offset: int, encoding: str = "utf-8", reason: str = "") -> str:
    """What to say of the file ``path`` whose byte at ``offset`` is not ``encoding`` text: the
    byte, its offset and line, and the fix."""
    with open(path, "rb") as fh:
        head = fh.read(offset + 1)
    byte = f" 0x{head[offset]:02x}" if offset < len(head) else ""
    why = f" ({reason})" if reason else ""
    line = head.count(b"\n") + 1
    return (f"is not {encoding.upper()} text: the byte{byte} at byte offset {offset} (line {line}) cannot be "
            f"decoded{why}; save the file as UTF-8")


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
