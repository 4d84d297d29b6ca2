"""The model of a job (random weights, no download), its synthetic data, and where it trains."""

from __future__ import annotations

import os
from typing import Any

from .job import ARCHITECTURES, SIZES, TrainConfigError, read_config_file


def build_config(job: dict[str, Any], attn_implementation: str | None = None):
    """The transformers config of the job (preset or file, then the overrides)."""
    import transformers

    attn = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if job.get("config_file"):
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        fields = {**read_config_file(job["config_file"]), **job["overrides"]}
        n = fields.get("num_hidden_layers")
        if isinstance(fields.get("layer_types"), list) and isinstance(n, int) and len(fields["layer_types"]) > n:
            fields["layer_types"] = fields["layer_types"][:n]
        model_type = fields["model_type"]
        if model_type not in CONFIG_MAPPING:
            raise TrainConfigError(f"{job['config_file']}: model_type {model_type!r} is unknown to transformers "
                                   f"{transformers.__version__}; upgrade transformers")
        try:
            return CONFIG_MAPPING[model_type].from_dict({**fields, **attn})
        except (TypeError, ValueError) as e:
            raise TrainConfigError(f"{job['config_file']}: transformers cannot build a {model_type} config from it: "
                                   f"{e}") from None
    cfg_name, model_name, extra = ARCHITECTURES[job["architecture"]]
    cfg_cls = getattr(transformers, cfg_name, None)
    if cfg_cls is None or getattr(transformers, model_name, None) is None:
        raise TrainConfigError(f"transformers {transformers.__version__} has no {model_name}; upgrade transformers")
    kwargs = {**SIZES[job["size"]], **extra, **job["overrides"]}
    if job["architecture"] == "qwen3_5":
        kwargs.setdefault("layer_types", ["full_attention"] * kwargs["num_hidden_layers"])
    return cfg_cls(**kwargs, **attn)


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


def synthetic_batches(vocab: int, batch: int, seq: int, steps: int, seed: int, device, start: int = 0):
    """Learnable synthetic data: arithmetic progressions mod vocab with a random start and stride.
    ``start``: the batches of steps ``start + 1 .. steps`` only, the same as those of a run from
    step 0 (the earlier ones are drawn and dropped): where a resumed run's data stands."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    for i in range(steps):
        first = torch.randint(0, vocab, (batch, 1), generator=g)
        stride = torch.randint(1, 8, (batch, 1), generator=g)
        if i < start:
            continue
        ids = (first + stride * torch.arange(seq)) % vocab
        yield ids.to(device)


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


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
