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
    "transformers+fsdp2": "plain transformers, attn_implementation sdpa, no veomni-ops, sharded as a user's own "
                          "script does (fully_shard on each decoder layer and the root; bf16 params / fp32 reduce "
                          "for a bf16 job), AdamW; under torchrun, in the same ranks after the job's run",
    "transformers+fsdp2+compile": "transformers+fsdp2 with each decoder layer torch.compile'd after fully_shard "
                                  "(train.compile_backend); under torchrun, in the same ranks after the job's run",
}

#: the baselines that run over the ranks of a torchrun job (the others run in one process)
FSDP2_BASELINES = ("transformers+fsdp2", "transformers+fsdp2+compile")


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


def check_in_ranks(name: str, job: dict[str, Any], parallel: bool) -> None:
    """Refuse a baseline that cannot run the way this command runs: the FSDP2 ones need the ranks
    of a torchrun job and a data-parallel layout; the others need one process."""
    layout = job.get("parallel")
    if name in FSDP2_BASELINES and not parallel:
        n = layout.world_size if layout is not None and layout.world_size > 1 else "N"
        raise TrainConfigError(f"--baseline {name} shards the model over the ranks of a torchrun job, and this "
                               f"command runs in one process; run it under torchrun: torchrun --nproc-per-node {n} "
                               f"-m veomni_ops.cli train {job['path']} --baseline {name} (with parallel: {{dp_shard: "
                               f"{n}}} or no parallel: section), or use --baseline "
                               f"{name.replace('+fsdp2', '')} in one process")
    if name in FSDP2_BASELINES and layout is not None and (layout.sp > 1 or layout.ep > 1):
        raise TrainConfigError(f"--baseline {name} is data parallel only, as a user's FSDP2 script is (every rank "
                               f"its rows of the global batch, the whole sequence, every expert), and {job['path']}'s "
                               f"layout has sp {layout.sp}, ep {layout.ep}, which it cannot reproduce; compare it with "
                               f"a layout of dp_shard only (parallel: {{dp_shard: {layout.world_size}}}), or drop "
                               "this baseline")
    if name not in FSDP2_BASELINES and parallel:
        why = ("it patches transformers' classes for the whole process, which every later run in these ranks would "
               "then use" if name == "liger" else "it trains the model unsharded in one process")
        raise TrainConfigError(f"--baseline {name} runs in one process ({why}), and this command runs under torchrun; "
                               f"under torchrun use --baseline transformers+fsdp2 or transformers+fsdp2+compile (plain "
                               f"transformers sharded by FSDP2 over the same ranks), or run --baseline {name} "
                               "without torchrun")


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
