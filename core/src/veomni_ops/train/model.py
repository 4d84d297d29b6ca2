"""The model of a job (random weights, no download), its synthetic data, and where it trains."""

from __future__ import annotations

import os
from typing import Any

from .config_keys import config_keys  # noqa: F401  (re-exported, as before the job needed it)
from .data import synthetic_batches  # noqa: F401  (re-exported: the job's data is data.py's)
from .job import (  # noqa: F401  (config_class, resolve_device: re-exported, as before the job needed them)
    ARCHITECTURES,
    SIZES,
    TrainConfigError,
    config_class,
    read_config_file,
    resolve_device,
)


def build_config(job: dict[str, Any], attn_implementation: str | None = None):
    """The transformers config of the job (preset or file, then the overrides)."""
    attn = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if job.get("config_file"):
        fields = {**read_config_file(job["config_file"]), **job["overrides"]}
        n = fields.get("num_hidden_layers")
        if isinstance(fields.get("layer_types"), list) and isinstance(n, int) and len(fields["layer_types"]) > n:
            fields["layer_types"] = fields["layer_types"][:n]
        model_type = fields["model_type"]
        cls = config_class(job, model_type)
        try:
            return cls.from_dict({**fields, **attn})
        except (TypeError, ValueError) as e:
            raise TrainConfigError(f"{job['config_file']}: transformers cannot build a {model_type} config from it: "
                                   f"{e}") from None
    kwargs = {**SIZES[job["size"]], **ARCHITECTURES[job["architecture"]][2], **job["overrides"]}
    if job["architecture"] == "qwen3_5":
        kwargs.setdefault("layer_types", ["full_attention"] * kwargs["num_hidden_layers"])
    return config_class(job)(**kwargs, **attn)


def build_model(job: dict[str, Any], device: str = "cpu", attn_implementation: str | None = None):
    """The job's model with random weights from ``train.seed``, built in float32 on ``device``
    (``meta``: shapes only, no memory and no random draws; see :func:`reference_model`)."""
    import torch
    import transformers

    cfg = build_config(job, attn_implementation)
    torch.manual_seed(job["train"]["seed"])
    with torch.device(device):
        if job.get("config_file"):
            try:
                return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
            except ValueError as e:
                raise TrainConfigError(f"{job['config_file']}: transformers has no causal-LM class for model_type "
                                       f"{cfg.model_type!r} ({e})") from None
        return getattr(transformers, ARCHITECTURES[job["architecture"]][1])(cfg)


def checkpoint_layers(model) -> dict[str, Any]:
    """Activation checkpointing of ``model``'s decoder layers (``train.gradient_checkpointing``),
    as a transformers user turns it on: ``activation_checkpointing_enable`` (transformers >= 5.24;
    before it ``gradient_checkpointing_enable``) with ``use_reentrant=False``. Each decoder layer
    then keeps only its inputs from the forward and runs its forward again in the backward.
    transformers checkpoints the layer's ``forward``, not its call, so FSDP2's hooks (the
    all-gathers) stay outside the checkpoint, and a decoder layer compiled in place
    (:func:`veomni_ops.parallel.fsdp.compile_layers`) compiles the checkpointed forward. Returns
    what was done (for the run's report); a model that cannot is a :class:`TrainConfigError`."""
    import transformers

    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)
    try:
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs)
            how = "activation_checkpointing_enable"
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            how = "gradient_checkpointing_enable"
    except ValueError as e:
        raise TrainConfigError(f"train.gradient_checkpointing: transformers {transformers.__version__}'s "
                               f"{type(model).__name__} cannot checkpoint its layers ({e}); set "
                               "gradient_checkpointing: false") from None
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
    if not layers:
        raise TrainConfigError(f"train.gradient_checkpointing: transformers {transformers.__version__}'s "
                               f"{type(model).__name__} has no layer it checkpoints; set gradient_checkpointing: "
                               "false")
    kinds = sorted({type(m).__name__.removeprefix("FSDP") for m in layers})
    return {"layers": len(layers), "classes": kinds, "how": f"transformers' model.{how}(use_reentrant=False)"}


def reference_model(job: dict[str, Any], dtype):
    """The weights ``train.init_device: meta`` gives the job's model: :func:`build_model` on the
    CPU (the seed's CPU random stream), cast to ``dtype`` as the training path casts. On a CPU job
    these are the weights of the normal build, bit for bit; on a GPU the normal build draws from
    the GPU's generator instead, so meta init gives the weights of the CPU build (the same on
    every machine and layout). Built with every CPU thread this process may use (under torchrun
    each rank gets one; the other ranks wait for this one); CPU random fills are serial, so the
    thread count does not change them."""
    import torch

    threads = torch.get_num_threads()
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or threads
    torch.set_num_threads(max(threads, cpus))
    try:
        return build_model(job, "cpu").to(dtype=dtype)
    finally:
        torch.set_num_threads(threads)


def peak_bytes(device: str) -> tuple[int, str]:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(), "peak allocated"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak RSS"


def adamw(params: Any, lr: float, device: str):
    """AdamW for a run of ``veomni-ops train``: on CUDA PyTorch's fused implementation (one
    kernel launch per step where the default launches a dozen ``_foreach`` ops and reads each
    parameter's step count on the host: host time a small model's step is bound by; the 2026-11-26
    profile of a compiled Qwen3-MoE small step on an H100 showed 18 ms of optimizer host time in a
    63 ms step). transformers' ``Trainer`` defaults to the same (``adamw_torch_fused``). Every run of
    a comparison takes it (the job, each one-process baseline, the plain FSDP2 peer; the layouts'
    runtime groups its sharded parameters by mesh the same way): the optimizer is not what is
    compared. Elsewhere PyTorch's default implementation."""
    import torch

    return torch.optim.AdamW(params, lr=lr, fused=True if str(device).startswith("cuda") else None)


def step_hooks(facts: dict[str, Any], before_step: Any = None) -> Any:
    """The training loop's ``before_step(n)``: ``before_step`` as given, unless the job's layers were
    compiled with ``mode="reduce-overhead"`` (``facts["compile"]``): then each step first calls
    ``torch.compiler.cudagraph_mark_step_begin()``, which starts a new generation of the CUDA graph
    trees, so that no layer's forward waits on the last step's backward (without it torch warns
    that the graphs cannot take their fast path), and then ``before_step(n)`` if given."""
    if (facts.get("compile") or {}).get("mode") != "reduce-overhead":
        return before_step
    import torch

    def begin(n: int) -> None:
        torch.compiler.cudagraph_mark_step_begin()
        if before_step is not None:
            before_step(n)

    return begin
