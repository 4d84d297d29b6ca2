"""The job YAML of ``veomni-ops train``: its model, ops and train sections, checked and
filled with defaults (see :mod:`veomni_ops.train` for the format)."""

from __future__ import annotations

import json
import os
from typing import Any

#: architecture -> (transformers config class, causal-LM class, extra config kwargs)
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {"output_router_logits": True}),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", {}),
}

#: size preset -> config kwargs. "small" keeps Qwen's real vocabulary, where the logits dominate memory.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2),
    "small": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=64,
                  moe_intermediate_size=384, num_experts=32, num_experts_per_tok=4),
}

TRAIN_DEFAULTS: dict[str, Any] = dict(batch_size=4, seq_len=128, steps=20, lr=1e-3, dtype="float32",
                                      device="auto", seed=0, compile=False)


class TrainConfigError(ValueError):
    """A job YAML or a train option is malformed or cannot run here (the CLI reports it and exits 1)."""


class RunFailed(RuntimeError):
    """A training run in a child process failed (its output is above)."""


def load_job(path: str) -> dict[str, Any]:
    import yaml

    from ..config import ConfigError, OpsConfig

    try:
        with open(path) as fh:
            data = yaml.safe_load(fh) or {}
    except FileNotFoundError:
        raise
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise TrainConfigError(f"{path}: expected a mapping with a 'model:' section (architecture and size, or "
                               "config_file; ops_implementation)")
    model = dict(data["model"])
    overrides = model.pop("config", None) or {}
    config_file = model.pop("config_file", None)
    if isinstance(overrides, str):
        if config_file is not None:
            raise TrainConfigError(f"{path}: model.config is a path and model.config_file is set too; use "
                                   "config_file: PATH and config: {field: value} for overrides")
        config_file, overrides = overrides, {}
    if not isinstance(overrides, dict):
        raise TrainConfigError(f"{path}: model.config must be a mapping of config fields to override (or the path "
                               f"of a config.json), not {type(overrides).__name__}")
    arch = str(model.pop("architecture", "") or "").lower()
    size = model.pop("size", None)
    if config_file is not None:
        if size is not None:
            raise TrainConfigError(f"{path}: model.size is a preset of ours; with model.config_file the file gives "
                                   "the shapes: remove size (override fields under model.config)")
        config_file = os.path.join(os.path.dirname(os.path.abspath(path)), os.path.expanduser(str(config_file)))
        file_cfg = read_config_file(config_file)
        model_type = str(file_cfg.get("model_type") or "")
        if not model_type:
            raise TrainConfigError(f"{config_file}: has no 'model_type'; it is not a transformers config.json")
        if arch and arch != model_type:
            raise TrainConfigError(f"{path}: model.architecture {arch!r} disagrees with model_type {model_type!r} of "
                                   f"{config_file}; remove architecture (the file decides)")
        arch, size = model_type, None
    else:
        if arch not in ARCHITECTURES:
            raise TrainConfigError(f"{path}: model.architecture {arch!r} is not one of: {', '.join(ARCHITECTURES)} "
                                   "(or give model.config_file: a transformers config.json)")
        size = str(size or "tiny").lower()
        if size not in SIZES:
            raise TrainConfigError(f"{path}: model.size {size!r} is not one of: {', '.join(SIZES)}")
    ops = OpsConfig.from_dict(model.pop("ops_implementation", None) or {})
    if model:
        raise TrainConfigError(f"{path}: unknown model field(s): {', '.join(model)}; known: architecture, size, "
                               "config_file, config, ops_implementation")
    train = dict(TRAIN_DEFAULTS)
    extra = set(data.get("train") or {}) - set(TRAIN_DEFAULTS)
    if extra:
        raise TrainConfigError(f"{path}: unknown train field(s): {', '.join(sorted(extra))}; known: {', '.join(TRAIN_DEFAULTS)}")
    train.update(data.get("train") or {})
    if not isinstance(train["compile"], bool):
        raise TrainConfigError(f"{path}: train.compile must be true or false, not {train['compile']!r}")
    unknown_top = set(data) - {"model", "train", "parallel", "lock"}
    if unknown_top:
        raise TrainConfigError(f"{path}: unknown section(s): {', '.join(sorted(unknown_top))}; known: model, train, "
                               "parallel, lock")
    return {"path": path, "architecture": arch, "size": size, "config_file": config_file, "ops": ops,
            "overrides": overrides, "train": train, "parallel": _load_parallel(path, data.get("parallel")),
            "lock": job_lock(path, data.get("lock"))}


def job_lock(path: str, value: Any):
    """The job's ``lock: PATH`` key (relative to the YAML's folder) as a found lock
    (:class:`veomni_ops.lock.LockFile`, not explicit: a missing or mismatched file is ignored with a
    warning), or None."""
    from ..lock import LockFile

    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise TrainConfigError(f"{path}: lock must be the path of a plan lock file (veomni-ops tune writes one), "
                               f"not {value!r}")
    where = os.path.join(os.path.dirname(os.path.abspath(path)), os.path.expanduser(value))
    return LockFile(os.path.normpath(where), explicit=False, origin=f"lock: in {path}")


def _load_parallel(path: str, section: Any):
    """The job's ``parallel:`` layout (:class:`veomni_ops.parallel.ParallelLayout`), or None."""
    if section is None:
        return None
    from ..parallel.layout import ParallelConfigError, ParallelLayout

    try:
        return ParallelLayout.from_dict(section)
    except ParallelConfigError as e:
        raise ParallelConfigError(f"{path}: {e}") from None


def read_config_file(path: str) -> dict[str, Any]:
    """The fields of a transformers ``config.json`` (``path`` is the file or its folder)."""
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise TrainConfigError(f"model.config_file: {file} does not exist") from None
    except json.JSONDecodeError as e:
        raise TrainConfigError(f"model.config_file: {file} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise TrainConfigError(f"model.config_file: {file} holds no JSON object")
    return data


