"""The job YAML of ``veomni-ops train``: its model, ops and train sections, checked and
filled with defaults (see :mod:`veomni_ops.train` for the format)."""

from __future__ import annotations

import difflib
import json
import math
import os
from typing import Any

from .errors import TrainConfigError

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
                                      device="auto", seed=0, compile=False,
                                      compile_backend="inductor", init_device="device",
                                      checkpoint_dir=None, checkpoint_every=0, resume=False)

#: Where train.init_device builds the model: on train.device (``device``), or on the meta device
#: (``meta``: no memory; materialised after FSDP2 sharded it, then given the weights the normal
#: build has, see :func:`veomni_ops.train.model.reference_model`).
INIT_DEVICES = ("device", "meta")


#: What train.dtype may be (torch dtype names), and spellings people write for them.
DTYPES = ("float32", "bfloat16", "float16", "float64")
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
                 "fp64": "float64", "double": "float64"}
#: torch device types train.device may name (with an index: cuda:1), besides auto.
TRAIN_DEVICES = ("cpu", "cuda", "mps", "xpu", "npu")
#: The job's sections, and the model section's fields.
SECTIONS = ("model", "train", "parallel", "lock")
MODEL_FIELDS = ("architecture", "size", "config_file", "config", "ops_implementation")


def load_job(path: str, here: bool = True, defaults: str = "auto") -> dict[str, Any]:
    """The job of the YAML file ``path``, every field checked before anything is built: every
    mistake of the file (sections, model, ops_implementation, train, parallel) is raised together
    in one :class:`TrainConfigError`. ``here`` (the default; what ``veomni-ops train`` does):
    also that it can run on this machine, its train.device one torch sees and the kernels it
    names usable here; ``here=False`` reads a job meant for another machine (a GPU job on a laptop).
    ``defaults``: what an ops field the job omits is, ``auto`` or ``veomni`` (VeOmni's default for
    it, as ``veomni-ops resolve --defaults veomni``; it is then checked like a kernel the job names)."""
    from ..config import load_yaml
    from ..veomni import DEFAULTS

    if defaults not in DEFAULTS:
        raise TrainConfigError(f"defaults must be one of {', '.join(map(repr, DEFAULTS))}, got {defaults!r}")

    data, problems = load_yaml(path)
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise TrainConfigError(f"{path}: expected a mapping with a 'model:' section (architecture and size, or "
                               f"config_file; ops_implementation), not {type(data).__name__}")
    problems += _unknown(data, SECTIONS, "section", "")
    model = _section(data, "model", problems, required=True)
    job = _load_model(path, model, problems, defaults)
    job["train"] = train = _load_train(data.get("train"), problems, here)
    job["parallel"] = _load_parallel(data.get("parallel"), train, problems)
    problems += _load_checkpointing(path, train, here)
    try:
        job["lock"] = job_lock(path, data.get("lock"))
    except TrainConfigError as e:
        problems.append(str(e).removeprefix(f"{path}: "))
    if here:  # the kernels it names, resolved for where it trains (nothing imported), beside the other mistakes
        problems += _named_kernel_refusals(job)
    if problems:
        if len(problems) == 1:
            raise TrainConfigError(f"{path}: {problems[0]}", problems)
        raise TrainConfigError(f"{path}: {len(problems)} problems in the job:\n"
                               + "\n".join(f"  - {p}" for p in problems), problems)
    return {"path": path, **job}


def _unknown(section: dict[str, Any], known: tuple[str, ...], what: str, prefix: str) -> list[str]:
    """One problem per key of ``section`` not in ``known``, with a did-you-mean where one is close."""
    out = []
    for key in section:
        if key in known:
            continue
        guess = difflib.get_close_matches(str(key), known, n=1, cutoff=0.7)
        hint = f"did you mean {prefix}{guess[0]}?" if guess else f"known: {', '.join(known)}"
        out.append(f"unknown {what} {prefix}{key}; {hint}")
    return out


def _section(data: dict[str, Any], name: str, problems: list[str], required: bool = False) -> dict[str, Any]:
    value = data.get(name)
    if value is None:
        typo = next((k for k in data if difflib.get_close_matches(str(k), [name], cutoff=0.7)), None)
        if required and typo is None:
            problems.append(f"no '{name}:' section: the job needs one (architecture and size, or config_file; "
                            "ops_implementation)")
        return {}
    if not isinstance(value, dict):
        problems.append(f"{name} must be a mapping of fields, not {type(value).__name__} {value!r}")
        return {}
    return value


def _load_model(path: str, model: dict[str, Any], problems: list[str], defaults: str = "auto") -> dict[str, Any]:
    """architecture, size, config_file, config overrides and the ops config of ``model:``."""
    from ..config import OpsConfig, read_config

    if not model:  # missing or misspelt (said already): its fields are not checked
        return {"architecture": "", "size": None, "config_file": None, "ops": OpsConfig.from_dict({}, defaults=defaults),
                "overrides": {}}
    problems += _unknown(model, MODEL_FIELDS, "model field", "model.")
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
    ops, ops_problems = read_config(model.get("ops_implementation") or {}, defaults=defaults)
    problems += [f"model.ops_implementation: {p}" for p in ops_problems]
    return {"architecture": arch, "size": size, "config_file": config_file, "ops": ops, "overrides": overrides}


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


def _load_train(section: Any, problems: list[str], here: bool) -> dict[str, Any]:
    """train: every field checked (types, ranges, names; with ``here``, the device is one torch sees)."""
    train = dict(TRAIN_DEFAULTS)
    if section is None:
        return train
    if not isinstance(section, dict):
        problems.append(f"train must be a mapping of fields ({', '.join(TRAIN_DEFAULTS)}), not "
                        f"{type(section).__name__} {section!r}")
        return train
    problems += _unknown(section, tuple(TRAIN_DEFAULTS), "train field", "train.")
    train.update((k, v) for k, v in section.items() if k in TRAIN_DEFAULTS)
    for name, lowest, why in (("batch_size", 1, ""), ("steps", 1, ""),
                              ("seq_len", 2, " (the loss predicts each next token: one token has none)")):
        value = train[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            problems.append(f"train.{name} must be a whole number >= {lowest}{why}, got {value!r}")
    seed = train["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63 - 1:
        problems.append(f"train.seed must be a whole number >= 0, got {seed!r}")
    train["lr"] = _learning_rate(train["lr"], problems)
    dtype = train["dtype"]
    if dtype not in DTYPES:
        alias = DTYPE_ALIASES.get(str(dtype).lower())
        hint = f"write {alias}" if alias else f"one of: {', '.join(DTYPES)}"
        problems.append(f"train.dtype {dtype!r} is not a dtype name here; {hint}")
    if not isinstance(train["compile"], bool):
        problems.append(f"train.compile must be true or false, got {train['compile']!r}")
    reason = compile_backend_problem(train["compile_backend"], here and train["compile"] is True)
    if reason:
        problems.append(f"train.compile_backend {train['compile_backend']!r}: {reason}")
    if train["init_device"] not in INIT_DEVICES:
        hint = (" (the model is built on train.device unless it is meta)"
                if str(train["init_device"]).split(":")[0] in TRAIN_DEVICES else "")
        problems.append(f"train.init_device must be one of: {', '.join(INIT_DEVICES)}, got "
                        f"{train['init_device']!r}{hint}")
    reason = device_problem(train["device"], here)
    if reason:
        problems.append(f"train.device {train['device']!r}: {reason}")
    return train


def check_checkpointing(job: dict[str, Any]) -> None:
    """Check the job's checkpoint fields again (after an option changed them, e.g. ``--resume``)."""
    problems = _load_checkpointing(job["path"], job["train"], True)
    if problems:
        raise TrainConfigError(f"{job['path']}: " + "; ".join(problems), problems)


def _load_checkpointing(path: str, train: dict[str, Any], here: bool) -> list[str]:
    """train.checkpoint_dir, checkpoint_every and resume (:mod:`veomni_ops.train.checkpoint`):
    paths made absolute (relative ones are the YAML's folder's); with ``here``, that the
    checkpoint ``resume`` names is there. Returns the problems."""
    from .checkpoint import find_resume

    problems = _checkpoint_dir(path, train)
    every = train["checkpoint_every"]
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        problems.append(f"train.checkpoint_every must be a whole number of steps >= 0 (0: a checkpoint at the last "
                        f"step only), got {every!r}")
    elif every and train["checkpoint_dir"] is None:
        problems.append("train.checkpoint_every needs train.checkpoint_dir: the folder to write the checkpoints into")
    problems += _resume(path, train)
    if here and not problems:
        try:
            find_resume(train)
        except TrainConfigError as e:
            problems.append(str(e))
    return problems


def _checkpoint_dir(path: str, train: dict[str, Any]) -> list[str]:
    folder = train["checkpoint_dir"]
    if folder is None:
        return []
    if not isinstance(folder, str) or not folder.strip():
        return [f"train.checkpoint_dir must be the path of a folder to write checkpoints into, not {folder!r}"]
    folder = train["checkpoint_dir"] = _job_path(path, folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        return [f"train.checkpoint_dir {folder} is a file, not a folder: name a folder (it is made where it is "
                "missing)"]
    return []


def _resume(path: str, train: dict[str, Any]) -> list[str]:
    resume = train["resume"]
    if resume is None or resume is False:
        train["resume"] = False
    elif resume is True or resume == "auto":
        if train["checkpoint_dir"] is None:
            return [f"train.resume: {'true' if resume is True else resume} resumes from the latest checkpoint in "
                    "train.checkpoint_dir, which is not set: set checkpoint_dir, or give resume: PATH of a checkpoint"]
    elif isinstance(resume, str) and resume.strip():
        train["resume"] = _job_path(path, resume)
    else:
        return [f"train.resume must be true (the latest checkpoint in checkpoint_dir), auto (the same, or a fresh "
                f"start where there is none), false, or the path of a checkpoint; got {resume!r}"]
    return []


def _job_path(path: str, value: str) -> str:
    """``value``, a path in the job file ``path``, made absolute (relative: to the file's folder)."""
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), os.path.expanduser(value)))


def compile_backend_problem(backend: Any, check_registered: bool = False) -> str | None:
    """Why ``backend`` (train.compile_backend) cannot be given to ``torch.compile``, or None.
    ``check_registered``: also that this torch has such a backend (imports ``torch._dynamo``)."""
    if not isinstance(backend, str) or not backend.strip():
        return "write the name of a torch.compile backend (inductor, the default; aot_eager; cudagraphs)"
    if not check_registered or backend == TRAIN_DEFAULTS["compile_backend"]:
        return None
    import torch._dynamo

    if backend not in torch._dynamo.list_backends(exclude_tags=()):
        known = torch._dynamo.list_backends()  # without the debugging ones
        guess = difflib.get_close_matches(backend, [*known, "aot_eager", "eager"], n=1, cutoff=0.7)
        hint = f"did you mean {guess[0]}? " if guess else ""
        return (f"torch {torch.__version__} has no such compile backend; {hint}known: {', '.join(known)} "
                "(and debugging ones such as aot_eager and eager)")
    return None


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
    return LockFile(_job_path(path, value), explicit=False, origin=f"lock: in {path}")


def _learning_rate(value: Any, problems: list[str]) -> Any:
    """train.lr as a float (YAML reads ``1e-3``, without a dot, as a string: it is a number here)."""
    try:
        lr = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        lr = math.nan
    if not (math.isfinite(lr) and lr > 0):
        problems.append(f"train.lr must be a number > 0 (e.g. 1.0e-3), got {value!r}")
        return value
    return lr


def device_problem(device: Any, here: bool = True) -> str | None:
    """Why ``device`` (train.device) cannot be trained on, or None: ``auto``, or a torch device
    (``cpu``, ``cuda``, ``cuda:1``, ``mps``, ``xpu``, ``npu``); with ``here``, one torch sees on this machine."""
    if device == "auto":
        return None
    text = str(device).strip().lower()
    kind, colon, index = text.partition(":")
    if kind == "gpu":
        return "does not say which kind of GPU: write cuda (NVIDIA, and AMD under ROCm torch) or xpu (Intel), or auto"
    if kind == "rocm":
        return "ROCm GPUs are cuda to torch: write cuda (or auto)"
    if not isinstance(device, str) or kind not in TRAIN_DEVICES or (colon and not index.isdigit()):
        return f"write auto, or a torch device: {', '.join(TRAIN_DEVICES)}, with an index for a GPU (cuda:1)"
    if colon and kind in ("cpu", "mps"):
        return f"{kind} takes no index: write {kind}"
    if kind == "cpu" or not here:
        return None
    count = _device_count(kind)
    if count == 0:
        return f"torch sees no {kind} device on this machine; write device: cpu, or auto (a GPU where there is one)"
    if colon and int(index) >= count:
        return f"torch sees {count} {kind} device(s) here (indices 0..{count - 1})"
    return None


def _device_count(kind: str) -> int:
    import torch

    if kind == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "mps":
        return int(torch.backends.mps.is_available())
    if kind == "xpu":
        return torch.xpu.device_count() if hasattr(torch, "xpu") and torch.xpu.is_available() else 0
    try:  # npu: torch_npu adds torch.npu where the CANN stack is
        import torch_npu  # noqa: F401

        return int(torch.npu.device_count())  # type: ignore[attr-defined]
    except Exception:
        return 0


def _load_parallel(section: Any, train: dict[str, Any], problems: list[str]):
    """The job's ``parallel:`` layout (:class:`veomni_ops.parallel.ParallelLayout`), or None."""
    if section is None:
        return None
    from ..parallel.layout import ParallelConfigError, ParallelLayout, read_fields

    fields, found = read_fields(section)
    problems += found
    # what the well-formed fields say is checked too, beside the section's own problems
    ranks = ParallelLayout(**{k: v for k, v in fields.items() if k in ("dp_shard", "sp")})
    b = train["batch_size"]
    if isinstance(b, int) and not isinstance(b, bool) and b >= 1:
        try:
            ranks.check_batch(b)
        except ParallelConfigError as e:
            problems.append(str(e))
    return None if found else ParallelLayout(**fields)


def plan_device(device: str):
    """The device to resolve the plan for: the detected one (None), unless the job trains on the
    CPU of a GPU machine."""
    from ..device import DeviceInfo, current_device

    if device.split(":")[0] == "cpu" and current_device().type != "cpu":
        return DeviceInfo("cpu", None, "cpu")
    return None


def _named_kernel_refusals(job: dict[str, Any]) -> list[str]:
    """Why a kernel the job names (not ``auto``) cannot be had where it trains: resolved as
    binding will (device, dtype, a backward, compile mode), without importing it. The model's
    own needs (variants, features) are checked when it is bound."""
    from ..config import AUTO, OP_TO_FIELD
    from ..discovery import discover
    from ..resolve import ResolutionError, _all_needs, resolve

    ops, t = job["ops"], job["train"]
    named = [op for op in OP_TO_FIELD if ops.for_op(op) != AUTO]
    if not named or t["dtype"] not in DTYPES or not isinstance(t["compile"], bool) or device_problem(t["device"]):
        return []  # where or how it trains is a mistake of its own (said already): nothing to resolve for
    reg = discover()
    needs = {op: v for op, v in _all_needs(reg, ops).items() if op in named}
    try:
        resolve(ops, plan_device(t["device"]), needs=needs, registry=reg, dtype=t["dtype"], compile=t["compile"],
                load=False)
    except ResolutionError as e:
        return [f"model.ops_implementation: {r.describe()}" for r in e.refusals]
    return []


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


