"""The ``--baseline`` runs: the first job without veomni-ops (plain transformers, compiled,
or Liger-Kernel's own patch), and the checks that refuse one that cannot run here."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from .job import TrainConfigError
from .model import resolve_device

#: baseline name -> what it is. Each runs the first config's job with no veomni-ops at all.
BASELINES: dict[str, str] = {
    "transformers": "plain transformers, attn_implementation sdpa, no veomni-ops",
    "transformers+compile": "plain transformers under torch.compile, attn_implementation sdpa, no veomni-ops",
    "liger": "Liger-Kernel's own monkey patch for the model type (its defaults), attn_implementation sdpa",
}



def liger_version() -> str | None:
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_baseline(name: str, job: dict[str, Any], device: str | None = None) -> None:
    """Refuse a baseline that cannot run here, before anything is trained."""
    if name not in BASELINES:
        raise TrainConfigError(f"--baseline {name!r} is not one of: {', '.join(BASELINES)}")
    if name != "liger":
        return
    if liger_version() is None:
        raise TrainConfigError("--baseline liger needs Liger-Kernel, which is not installed here: "
                               "pip install liger-kernel (its kernels need a GPU)")
    device = device or resolve_device(job["train"]["device"])
    if device.split(":")[0] == "cpu":
        raise TrainConfigError(f"--baseline liger: Liger-Kernel's kernels are Triton GPU kernels and {job['path']} "
                               "trains on cpu; run it on a GPU (train.device: cuda or auto) or drop this baseline")


def apply_liger(model) -> str:
    """Liger-Kernel's own patch for this model type, on the instance. Returns the function's name.

    It also replaces transformers' module-level classes and functions for the model type, for
    the whole process: the liger baseline runs only in a child process of its own.
    """
    try:
        from liger_kernel.transformers import monkey_patch
    except ImportError as e:
        raise TrainConfigError(f"--baseline liger: cannot import liger_kernel.transformers ({e}); "
                               "pip install liger-kernel") from None
    model_type = model.config.model_type
    fn = monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if fn is None:
        raise TrainConfigError(f"--baseline liger: Liger-Kernel {liger_version()} has no patch for model type "
                               f"{model_type!r}; drop this baseline for this model")
    fn(model=model)
    return fn.__name__


def compile_apply(apply):
    """``apply`` with compile=True, refused clearly where this veomni-ops has no such keyword."""
    import inspect

    if "compile" not in inspect.signature(apply).parameters:
        raise TrainConfigError("train.compile: true needs veomni_ops.apply(model, ops, compile=True), which this "
                               "veomni-ops does not have; upgrade veomni-ops or set train.compile: false")
    return apply
