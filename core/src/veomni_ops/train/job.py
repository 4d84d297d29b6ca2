"""The job YAML of ``veomni-ops train``: its model, ops, train and data sections, checked and
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
                                      device="auto", seed=0, threads="auto", compile=False,
                                      compile_backend="inductor", init_device="device",
                                      checkpoint_dir=None, checkpoint_every=0, resume=False,
                                      gradient_checkpointing=False)

#: The train fields that are true or false (null, ``compile:`` with no value, is refused as every field's is).
TRAIN_BOOLEANS = ("compile", "gradient_checkpointing")

#: Where train.init_device builds the model: on train.device (``device``), or on the meta device
#: (``meta``: no memory; materialised after FSDP2 sharded it, then given the weights the normal
#: build has, see :func:`veomni_ops.train.model.reference_model`).
INIT_DEVICES = ("device", "meta")


#: What train.dtype may be (torch dtype names; the bytes of one element), and spellings people write for them.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
DTYPES = tuple(DTYPE_BYTES)
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
                 "fp64": "float64", "double": "float64"}
#: torch device types train.device may name (with an index: cuda:1), besides auto.
TRAIN_DEVICES = ("cpu", "cuda", "mps", "xpu", "npu")
#: The job's sections, and the model section's fields.
SECTIONS = ("model", "train", "data", "parallel", "lock")
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
    problems += _config_overrides(job)
    job["train"] = train = _load_train(data.get("train"), problems, here)
    job["data"] = _load_data(data, train, problems)
    job["parallel"] = _load_parallel(data.get("parallel"), train, problems)
    problems += _step_memory(job, here)
    problems += _load_checkpointing(path, train, here)
    if "lock" in data and data["lock"] is None:
        problems.append(_no_value("lock", "write the path of a plan lock file, or remove the line (no lock)"))
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


def _no_value(field: str, fix: str) -> str:
    """The problem of ``field:`` written with no value: YAML reads it as null, which a job field
    never means (a section, ``train:`` or ``model.config:``, with nothing under it is empty)."""
    return f"{field} has no value (YAML reads '{field.rpartition('.')[2]}:' with nothing after it as null): {fix}"


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


#: How to install what ``veomni-ops train`` builds its models with (the ``models`` extra: transformers).
MODELS_INSTALL = 'pip install "veomni-ops[models]"'


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
    for name in (k for k in TRAIN_DEFAULTS if k in section and section[k] is None):
        default = TRAIN_DEFAULTS[name]
        problems.append(_no_value(f"train.{name}", "write auto, or a torch device (cpu, cuda), or remove the line "
                                  "(auto)" if name == "device" else "write a value, or remove the line (the default: "
                                  f"{'none' if default is None else str(default).lower()})"))
    train.update((k, v) for k, v in section.items() if k in TRAIN_DEFAULTS and v is not None)
    problems += _whole_numbers(train)
    train["lr"] = _learning_rate(train["lr"], problems)
    dtype = train["dtype"]
    if dtype not in DTYPES:
        alias = DTYPE_ALIASES.get(str(dtype).lower())
        hint = f"write {alias}" if alias else f"one of: {', '.join(DTYPES)}"
        problems.append(f"train.dtype {dtype!r} is not a dtype name here; {hint}")
    problems += [f"train.{name} must be true or false, got {train[name]!r}" for name in TRAIN_BOOLEANS
                 if not isinstance(train[name], bool)]
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


def _whole_numbers(train: dict[str, Any]) -> list[str]:
    """The problems of train's whole-number fields: batch_size, steps, seq_len, seed, threads."""
    problems = []
    for name, lowest, why in (("batch_size", 1, ""), ("steps", 1, ""),
                              ("seq_len", 2, " (the loss predicts each next token: one token has none)")):
        value = train[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            problems.append(f"train.{name} must be a whole number >= {lowest}{why}, got {value!r}")
    seed = train["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63 - 1:
        problems.append(f"train.seed must be a whole number >= 0, got {seed!r}")
    threads = train["threads"]
    if threads != "auto" and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        problems.append(f"train.threads must be auto (torch's count in this process; resuming, the checkpoint's) or "
                        f"a whole number of intra-op CPU threads >= 1, got {threads!r}")
    return problems


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _load_data(data: dict[str, Any], train: dict[str, Any], problems: list[str]) -> dict[str, Any] | None:
    """data: packed documents (:mod:`veomni_ops.train.data`), every field checked; None without
    the section (the synthetic rows of every job before it), else ``{"packing": bool, "doc_len":
    {...} or None}`` as written (the defaults are filled where the batches are made)."""
    from .data import DATA_DEFAULTS, DOC_LEN_DEFAULTS

    if "data" not in data:
        return None
    section = data["data"]
    if section is None:
        problems.append(_no_value("data", "write {packing: true} (documents packed into rows), or remove the line "
                                  "(unpacked rows)"))
        return None
    if not isinstance(section, dict):
        problems.append(f"data must be a mapping of fields ({', '.join(DATA_DEFAULTS)}), not "
                        f"{type(section).__name__} {section!r}")
        return None
    problems += _unknown(section, tuple(DATA_DEFAULTS), "data field", "data.")
    out = {**DATA_DEFAULTS, **{k: v for k, v in section.items() if k in DATA_DEFAULTS}}
    if "packing" in section and section["packing"] is None:
        problems.append(_no_value("data.packing", "write true (documents packed into rows) or false"))
        out["packing"] = False
    elif not isinstance(out["packing"], bool):
        problems.append(f"data.packing must be true or false, got {out['packing']!r}")
    lengths = out["doc_len"]
    if "doc_len" in section and lengths is None:
        problems.append(_no_value("data.doc_len", "write a mapping (mean, min, max, sigma), or remove the line "
                                  "(the defaults)"))
        return out
    if lengths is None:
        return out
    if not isinstance(lengths, dict):
        problems.append(f"data.doc_len must be a mapping of fields ({', '.join(DOC_LEN_DEFAULTS)}), not "
                        f"{type(lengths).__name__} {lengths!r}")
        return out
    if out["packing"] is False:
        problems.append("data.doc_len sets the lengths of packed documents, and data.packing is false: set "
                        "packing: true, or remove doc_len")
    problems += _doc_len(lengths, train["seq_len"])
    return out


def _doc_len(lengths: dict[str, Any], seq: Any) -> list[str]:
    """The problems of ``data.doc_len``: its fields, then their ranges (against ``train.seq_len``)."""
    from .data import DOC_LEN_ABOUT, DOC_LEN_DEFAULTS, doc_len

    problems = _unknown(lengths, tuple(DOC_LEN_DEFAULTS), "data.doc_len field", "data.doc_len.")
    for name in (k for k in DOC_LEN_DEFAULTS if k in lengths and lengths[k] is None):
        problems.append(_no_value(f"data.doc_len.{name}", f"write a value, or remove the line ({DOC_LEN_ABOUT[name]})"))
    ok = True
    for name, test, what in (("min", lambda v: _whole(v) and v >= 2,
                              "a whole number of tokens >= 2 (a document's first token is not predicted: one token "
                              "has nothing to learn)"),
                             ("max", lambda v: _whole(v) and v >= 2, "a whole number of tokens >= 2"),
                             ("mean", lambda v: _number(v) and v >= 1, "a number of tokens >= 1"),
                             ("sigma", lambda v: _number(v) and 0 < v <= 4,
                              "a number > 0 and <= 4 (the log-normal's shape; 1.0: a long tail)")):
        value = lengths.get(name)
        if value is not None and not test(value):
            problems.append(f"data.doc_len.{name} must be {what}, got {value!r}")
            ok = False
    if not ok or not (_whole(seq) and seq >= 2):
        return problems  # the ranges below need good values (each mistake is said already)
    given = {k: v for k, v in lengths.items() if k in DOC_LEN_DEFAULTS and v is not None}
    full = doc_len({"doc_len": given}, seq)
    if "max" in given and full["max"] > seq:
        problems.append(f"data.doc_len.max {full['max']} is over train.seq_len {seq}: a document is at most a row; "
                        f"lower max to {seq} or less (or remove it: {seq}), or raise train.seq_len")
    elif "min" in given and full["min"] > full["max"]:
        whose = "data.doc_len.max" if "max" in given else "train.seq_len (doc_len.max by default)"
        problems.append(f"data.doc_len.min {full['min']} is over {whose} {full['max']}: lower min, or raise "
                        f"{'max' if 'max' in given else 'train.seq_len'}")
    elif "mean" in given and not full["min"] <= full["mean"] <= full["max"]:
        problems.append(f"data.doc_len.mean {full['mean']} is outside [min, max] = [{full['min']}, {full['max']}]: "
                        "write a mean between them")
    return problems


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

    problems = _checkpoint_dir(path, train, here)
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


def _checkpoint_dir(path: str, train: dict[str, Any], here: bool) -> list[str]:
    """train.checkpoint_dir made absolute; with ``here``, made where it is missing and a file
    written into it and removed: a folder the job cannot write is refused before step 1, not at
    its first save (with the default ``checkpoint_every: 0``, the end of the run)."""
    folder = train["checkpoint_dir"]
    if folder is None:
        return []
    if not isinstance(folder, str) or not folder.strip():
        return [f"train.checkpoint_dir must be the path of a folder to write checkpoints into, not {folder!r}"]
    folder = train["checkpoint_dir"] = _job_path(path, folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        return [f"train.checkpoint_dir {folder} is a file, not a folder: name a folder (it is made where it is "
                "missing)"]
    if here:
        import tempfile

        try:
            os.makedirs(folder, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".veomni-ops-write-probe-"):
                pass
        except OSError as e:
            return [f"train.checkpoint_dir {folder} cannot be written ({type(e).__name__}: {e.strerror or e}"
                    f"{f': {e.filename}' if e.filename else ''}): the checkpoints would be lost at the first save; "
                    "make it writable (its owner, permissions, a mounted disk with space), or name another folder"]
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
    ranks = ParallelLayout(**{k: v for k, v in fields.items() if k in ("dp_replicate", "dp_shard", "sp")})
    b = train["batch_size"]
    if isinstance(b, int) and not isinstance(b, bool) and b >= 1:
        try:
            ranks.check_batch(b)
        except ParallelConfigError as e:
            problems.append(str(e))
    return None if found else ParallelLayout(**fields)


#: More memory than any one machine has (64 TiB; the largest shared-memory servers have about 48):
#: a step that needs more on each rank is refused wherever the job is meant to run, here or not.
MAX_STEP_BYTES = 64 * 2**40


def model_shape(job: dict[str, Any]) -> dict[str, int] | None:
    """The job model's ``hidden_size``, ``num_hidden_layers`` and ``vocab_size`` (its preset's or
    config file's, a multimodal file's ``text_config``'s, then ``model.config``'s), read without
    transformers; None where one is not a whole number > 0 (a mistake said elsewhere)."""
    if job["config_file"]:
        try:
            fields = read_config_file(job["config_file"])
        except TrainConfigError:
            return None
        text = fields.get("text_config")
        fields = {**(text if isinstance(text, dict) else {}), **fields}
    elif job["size"] in SIZES:
        fields = dict(SIZES[job["size"]])
    else:
        return None
    fields.update(job["overrides"])
    shape = {k: fields.get(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape.values()):
        return None
    return shape  # type: ignore[return-value]


def min_step_bytes(job: dict[str, Any]) -> tuple[int, str] | None:
    """A lower bound of the memory one rank needs for one training step of the job, and what it
    counts: each decoder layer's input, kept for its backward (the rank's tokens x hidden x
    layers, in train.dtype), and the input embedding's weights (vocab x hidden, sharded over
    ``dp_shard``). Every model and kernel needs at least these, so a job over its device's memory
    can never run; None where the job's shapes are mistakes of their own."""
    t, shape = job["train"], model_shape(job)
    fields_ok = all(isinstance(t[k], int) and not isinstance(t[k], bool) and t[k] >= 1 for k in ("batch_size", "seq_len"))
    if shape is None or not fields_ok or t["dtype"] not in DTYPE_BYTES:
        return None
    from ..parallel.layout import world_from_env

    layout = job["parallel"]  # without one, torchrun's processes are data-parallel ranks (one: no torchrun)
    dp, sp = (layout.dp_shard, layout.sp) if layout is not None else (world_from_env(), 1)
    tokens = -(-t["batch_size"] // (dp * (layout.dp_replicate if layout else 1))) * -(-t["seq_len"] // sp)
    hidden, layers, vocab = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    size = DTYPE_BYTES[t["dtype"]]
    need = tokens * hidden * layers * size + -(-vocab * hidden * size // dp)
    return need, (f"each layer's input kept for the backward, {tokens:,} tokens x hidden {hidden:,} x {layers:,} "
                  f"layers x {size} bytes, and the embedding, vocab {vocab:,} x hidden {hidden:,}"
                  + (f" / dp_shard {dp}" if dp > 1 else ""))


def _step_memory(job: dict[str, Any], here: bool) -> list[str]:
    """One problem where a training step cannot fit: its lower bound (:func:`min_step_bytes`) over
    the memory of train.device (``here``: a CUDA GPU's or, on the CPU, the machine's), or over
    :data:`MAX_STEP_BYTES` anywhere. Checked before anything is built or allocated."""
    found = min_step_bytes(job)
    if found is None:
        return []
    need, what = found
    t = job["train"]
    memory, where = MAX_STEP_BYTES, f"any one machine has ({_gib(MAX_STEP_BYTES)})"
    device = t["device"]
    if here and device_problem(device) is None:
        from ..parallel.fsdp import device_memory_bytes

        device = resolve_device(device)
        if device.split(":")[0] in ("cpu", "cuda"):  # elsewhere the host's memory says nothing of the device's
            have = device_memory_bytes(device)
            if 0 < have < memory:
                memory = have
                where = (f"this machine's memory ({_gib(have)})" if device == "cpu" else
                         f"the memory of {device} here ({_gib(have)})")
    if need <= memory:
        return []
    return [f"train.seq_len {t['seq_len']:,} and batch_size {t['batch_size']:,}: one training step needs at least "
            f"{_gib(need)} on each rank ({what}), more than {where}: lower seq_len or batch_size, or split the batch "
            "over more ranks (parallel.dp_shard, parallel.sp)"]


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


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
    own needs (variants, features) are checked when it is bound. A mistake in where or how it
    trains (said already) hides none of these: without a dtype or compile mode the names are
    resolved without that filter, and without a device each name is checked for what needs no
    device (that a plugin here registers it for the op; a VeOmni value whose kernel depends on the
    device, ``moe_implementation: fused``, is then left unchecked)."""
    from ..config import AUTO, OP_TO_FIELD
    from ..discovery import discover
    from ..resolve import RefusalKind, ResolutionError, _all_needs, resolve

    # The refusals that need no device: whether a plugin here registers the name for the op.
    by_name = {RefusalKind.UNKNOWN_NAME, RefusalKind.CONTESTED_NAME, RefusalKind.WRONG_VARIANT,
               RefusalKind.WRONG_DISTRIBUTION, RefusalKind.SWITCHED_OFF, RefusalKind.PLUGIN_FAILED}
    ops, t = job["ops"], job["train"]
    named = [op for op in OP_TO_FIELD if ops.for_op(op) != AUTO]
    device_known = device_problem(t["device"]) is None
    if not device_known:
        named = [op for op in named if len({ops.for_device(kind).for_op(op) for kind in TRAIN_DEVICES}) == 1]
    if not named:
        return []
    reg = discover()
    needs = {op: v for op, v in _all_needs(reg, ops).items() if op in named}
    try:
        resolve(ops, plan_device(t["device"]) if device_known else None, needs=needs, registry=reg,
                dtype=t["dtype"] if t["dtype"] in DTYPES else None, compile=t["compile"] is True, load=False)
    except ResolutionError as e:
        return [f"model.ops_implementation: {r.describe()}" for r in e.refusals
                if device_known or r.kind in by_name]
    return []


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


def resolve_device(name: str) -> str:
    """train.device as torch names it: ``auto`` is ``cuda`` where torch sees a GPU, else ``cpu``."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name
