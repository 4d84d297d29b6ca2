"""The job YAML of ``veomni-ops train``: its model, ops, train and data sections, checked and
filled with defaults (see :mod:`veomni_ops.train` for the format).

This module reads the whole job (:func:`load_job`); each part is checked in a module of its own,
whose names it re-exports: :mod:`~veomni_ops.train.job_schema` (sections, fields, defaults,
presets), :mod:`~veomni_ops.train.job_model` (``model:``), :mod:`~veomni_ops.train.job_train`
(``train:``, its device and checkpoint fields), :mod:`~veomni_ops.train.job_data` (``data:``,
``parallel:``) and :mod:`~veomni_ops.train.job_memory` (the memory bound of a step)."""

from __future__ import annotations

from typing import Any

from .errors import TrainConfigError
from .job_data import _doc_len, _load_data, _load_parallel, _number, _whole  # noqa: F401
from .job_memory import MAX_STEP_BYTES, _gib, _step_memory, min_step_bytes, model_shape  # noqa: F401
from .job_model import (  # noqa: F401
    _config_overrides,
    _load_model,
    _model_type,
    _ops_fields,
    config_class,
    read_config_file,
)
from .job_schema import (  # noqa: F401
    ARCHITECTURES,
    DTYPE_ALIASES,
    DTYPE_BYTES,
    DTYPES,
    INIT_DEVICES,
    MODEL_FIELDS,
    MODELS_INSTALL,
    SECTIONS,
    SIZES,
    TRAIN_BOOLEANS,
    TRAIN_DEFAULTS,
    TRAIN_DEVICES,
    _job_path,
    _no_value,
    _section,
    _unknown,
)
from .job_train import (  # noqa: F401
    _checkpoint_dir,
    _device_count,
    _learning_rate,
    _load_checkpointing,
    _load_train,
    _resume,
    _whole_numbers,
    check_checkpointing,
    compile_backend_problem,
    device_problem,
    plan_device,
    resolve_device,
)


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
