"""The ``model:`` section of the job YAML (see :mod:`veomni_ops.train.job`): architecture and size
or a transformers config.json, its ``config`` overrides (checked against the config class), and
``ops_implementation``."""

from __future__ import annotations

import difflib
import json
import os
from typing import Any

from .errors import TrainConfigError
from .job_schema import ARCHITECTURES, MODEL_FIELDS, MODELS_INSTALL, SIZES, _no_value, _unknown


def _ops_fields(block: Any, problems: list[str]) -> Any:
    """``model.ops_implementation`` without its fields that have no value, each a problem: in a job
    an empty field is a value forgotten. (:class:`~veomni_ops.config.OpsConfig` reads null as
    VeOmni does, where ``attn_implementation: null`` is its documented "no preference"; a job is
    not a VeOmni config.)"""
    from ..config import FIELD_TO_OP, UNMANAGED_FIELDS

    if not isinstance(block, dict):
        return block  # said by read_config
    empty = [k for k, v in block.items() if v is None and (k in FIELD_TO_OP or k in UNMANAGED_FIELDS)]
    problems += [_no_value(f"model.ops_implementation.{k}", "write auto (the best kernel usable here), eager or a "
                           "kernel name, or remove the line (auto)" if k in FIELD_TO_OP else "write its value, or "
                           "remove the line") for k in empty]
    return {k: v for k, v in block.items() if k not in empty}


def _load_model(path: str, model: dict[str, Any], problems: list[str], defaults: str = "auto") -> dict[str, Any]:
    """architecture, size, config_file, config overrides and the ops config of ``model:``."""
    from ..config import OpsConfig, read_config

    if not model:  # missing or misspelt (said already): its fields are not checked
        return {"architecture": "", "size": None, "config_file": None, "ops": OpsConfig.from_dict({}, defaults=defaults),
                "overrides": {}}
    problems += _unknown(model, MODEL_FIELDS, "model field", "model.")
    for name, fix in (("architecture", f"write one of: {', '.join(ARCHITECTURES)}"),
                      ("size", f"write one of: {', '.join(SIZES)}, or remove the line (tiny)"),
                      ("config_file", "write the path of a transformers config.json, or remove the line")):
        if name in model and model[name] is None:
            problems.append(_no_value(f"model.{name}", fix))
    overrides = model.get("config") or {}
    config_file = model.get("config_file")
    if isinstance(overrides, str):
        if config_file is not None:
            problems.append("model.config is a path and model.config_file is set too; use config_file: PATH and "
                            "config: {field: value} for overrides")
        config_file, overrides = overrides, {}
    if not isinstance(overrides, dict):
        problems.append("model.config must be a mapping of config fields to override (or the path of a config.json), "
                        f"not {type(overrides).__name__}")
        overrides = {}
    arch = str(model.get("architecture", "") or "").lower()
    size = model.get("size")
    if config_file is not None:
        if size is not None:
            problems.append("model.size is a preset of ours; with model.config_file the file gives the shapes: remove "
                            "size (override fields under model.config)")
        config_file = os.path.join(os.path.dirname(os.path.abspath(path)), os.path.expanduser(str(config_file)))
        arch, size = _model_type(config_file, arch, problems), None
    else:
        if arch not in ARCHITECTURES:
            problems.append(f"model.architecture {arch!r} is not one of: {', '.join(ARCHITECTURES)} (or give "
                            "model.config_file: a transformers config.json)")
        size = str(size or "tiny").lower()
        if size not in SIZES:
            problems.append(f"model.size {size!r} is not one of: {', '.join(SIZES)}")
    ops, ops_problems = read_config(_ops_fields(model.get("ops_implementation") or {}, problems), defaults=defaults)
    problems += [f"model.ops_implementation: {p}" for p in ops_problems]
    return {"architecture": arch, "size": size, "config_file": config_file, "ops": ops, "overrides": overrides}


def _config_overrides(job: dict[str, Any]) -> list[str]:
    """The problems of ``model.config``: a key the model's transformers config class does not
    take (a config stores any key, and no model reads a misspelt one), with the closest field.
    Needs transformers, as the job does: where it cannot be imported, that is the problem, with the
    install line."""
    try:
        import transformers
    except ImportError as e:
        return [f"the job's model is built with transformers, which cannot be imported here ({e}): "
                f"{MODELS_INSTALL}"]
    overrides = job["overrides"]
    if not overrides or not job["architecture"] or (not job["config_file"] and job["architecture"] not in ARCHITECTURES):
        return []  # nothing to check, or no model to check it against (said already)
    from .config_keys import config_keys

    try:
        cls = config_class(job)
    except TrainConfigError as e:
        return [str(e)]
    known = set(config_keys(cls))
    if job["config_file"]:
        try:  # a key the file has is the file's to give, and an override of it is too
            known |= set(read_config_file(job["config_file"]))
        except TrainConfigError:
            return []  # said already, where the file was read
    shown = sorted(k for k in known if not k.startswith("_") and not k.endswith("_internal"))
    out = []
    for key in overrides:
        if key in known:
            continue
        guess = difflib.get_close_matches(str(key), shown, n=1, cutoff=0.7)
        hint = f"did you mean model.config.{guess[0]}?" if guess else "remove it"
        out.append(f"unknown model.config field {key!r}: transformers {transformers.__version__}'s {cls.__name__} "
                   f"has no such field (it would be stored and read by nothing); {hint}")
    return out


def _model_type(config_file: str, arch: str, problems: list[str]) -> str:
    """The ``model_type`` of a transformers config.json (``arch`` where it cannot be read)."""
    try:
        file_cfg = read_config_file(config_file)
    except TrainConfigError as e:
        problems.append(str(e))
        return arch
    model_type = str(file_cfg.get("model_type") or "")
    if not model_type:
        problems.append(f"{config_file}: has no 'model_type'; it is not a transformers config.json")
    elif arch and arch != model_type:
        problems.append(f"model.architecture {arch!r} disagrees with model_type {model_type!r} of {config_file}; "
                        "remove architecture (the file decides)")
    return model_type


def read_config_file(path: str) -> dict[str, Any]:
    """The fields of a transformers ``config.json`` (``path`` is the file or its folder)."""
    from ..config import not_utf8

    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file, "rb") as fh:  # bytes: json reads UTF-8 (or UTF-16/32) whatever the locale
            data = json.load(fh)
    except FileNotFoundError:
        raise TrainConfigError(f"model.config_file: {file} does not exist") from None
    except UnicodeDecodeError as e:
        raise TrainConfigError(f"model.config_file: {file} {not_utf8(file, e.start, e.encoding, e.reason)}") from None
    except json.JSONDecodeError as e:
        raise TrainConfigError(f"model.config_file: {file} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise TrainConfigError(f"model.config_file: {file} holds no JSON object")
    return data


def config_class(job: dict[str, Any], model_type: str | None = None) -> Any:
    """The transformers config class of the job: its preset architecture's, or, for a
    ``config_file`` job, that of ``model_type`` (the file's, ``job["architecture"]``)."""
    import transformers

    if job.get("config_file"):
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        model_type = job["architecture"] if model_type is None else model_type
        if model_type not in CONFIG_MAPPING:
            raise TrainConfigError(f"{job['config_file']}: model_type {model_type!r} is unknown to transformers "
                                   f"{transformers.__version__}; upgrade transformers")
        return CONFIG_MAPPING[model_type]
    cfg_name, model_name, _ = ARCHITECTURES[job["architecture"]]
    cfg_cls = getattr(transformers, cfg_name, None)
    if cfg_cls is None or getattr(transformers, model_name, None) is None:
        raise TrainConfigError(f"transformers {transformers.__version__} has no {model_name}; upgrade transformers")
    return cfg_cls
