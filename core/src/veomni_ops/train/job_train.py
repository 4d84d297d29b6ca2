"""The ``train:`` section of the job YAML (see :mod:`veomni_ops.train.job`): its fields checked
(numbers, dtype, compile, device), and its checkpoint fields (``checkpoint_dir``,
``checkpoint_every``, ``resume``); the device a job trains and resolves its plan on."""

from __future__ import annotations

import difflib
import math
import os
from typing import Any

from .errors import TrainConfigError
from .job_schema import (
    COMPILE_MODES,
    DTYPE_ALIASES,
    DTYPES,
    INIT_DEVICES,
    TRAIN_BOOLEANS,
    TRAIN_DEFAULTS,
    TRAIN_DEVICES,
    _job_path,
    _no_value,
    _not_fields,
    _unknown,
)


def _load_train(section: Any, problems: list[str], here: bool) -> dict[str, Any]:
    """train: every field checked (types, ranges, names; with ``here``, the device is one torch sees)."""
    train = dict(TRAIN_DEFAULTS)
    if section is None:
        return train
    if not isinstance(section, dict):
        problems.append(_not_fields("train", section, TRAIN_DEFAULTS))
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
    reason = compile_mode_problem(train["compile_mode"], train["compile_backend"])
    if reason:
        problems.append(f"train.compile_mode {train['compile_mode']!r}: {reason}")
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


def compile_mode_problem(mode: Any, backend: Any) -> str | None:
    """Why ``mode`` (train.compile_mode) cannot be given to ``torch.compile`` with ``backend``, or None.
    A mode is inductor's: another backend takes none (torch.compile would refuse the pair)."""
    if mode not in COMPILE_MODES:
        guess = difflib.get_close_matches(str(mode), COMPILE_MODES, n=1, cutoff=0.6)
        return (f"{'did you mean ' + guess[0] + '? ' if guess else ''}write one of: {', '.join(COMPILE_MODES)} "
                "(torch.compile's modes; default is its own)")
    if mode != "default" and backend != "inductor":
        return (f"a mode is the inductor backend's; train.compile_backend is {backend!r}: set it to inductor, "
                "or remove train.compile_mode")
    return None


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


def plan_device(device: str):
    """The device to resolve the plan for: the detected one (None), unless the job trains on the
    CPU of a GPU machine."""
    from ..device import DeviceInfo, current_device

    if device.split(":")[0] == "cpu" and current_device().type != "cpu":
        return DeviceInfo("cpu", None, "cpu")
    return None


def resolve_device(name: str) -> str:
    """train.device as torch names it: ``auto`` is ``cuda`` where torch sees a GPU, else ``cpu``."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name
