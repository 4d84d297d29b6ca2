"""``veomni-ops train CONFIG.yaml [--compare OTHER.yaml] [--baseline NAME]... [--json] [--plot PNG]``: the main job.

Builds a transformers model (random weights from train.seed, initialised in float32 on the
training device, then cast to train.dtype; no download), resolves and prints the kernel plan,
binds it, and trains N steps of AdamW on synthetic token data.

    model:
      architecture: qwen3          # llama, qwen2, qwen3, qwen3_moe, qwen3_5 (offset norm, partial rotary)
      size: tiny                   # tiny, small
      config: {num_hidden_layers: 4}          # optional: overrides of the config's fields
      ops_implementation: {rms_norm_implementation: auto, ...}
    train: {batch_size: 4, seq_len: 128, steps: 20, lr: 1.0e-3, dtype: float32, device: auto, seed: 0,
            compile: false}
    parallel: {dp_shard: 2, sp: 2, ep: 2}    # optional: FSDP2 / Ulysses / experts over torchrun's processes

With ``parallel:`` (or under ``torchrun --nproc-per-node N``) every process is one rank of the job
(:mod:`veomni_ops.parallel`): the plan is resolved for the layout and its kernels wrapped, the
model FSDP2-sharded, each rank trains its part of the same global batch, and rank 0 reports the
global loss (the one-process loss). Without either, one process, as before.

The model's shapes come from one of two places:

* ``architecture`` + ``size``: a preset of ours (``SIZES``) for one of ``ARCHITECTURES``.
* ``config_file: PATH``: a transformers ``config.json`` (or the folder holding one), e.g. a
  real checkpoint's config with fewer layers. A relative PATH is read from the YAML's folder.
  The architecture is the file's ``model_type``, built through
  ``AutoModelForCausalLM.from_config``; ``size`` is refused and ``architecture``, if given,
  must equal ``model_type``. The file is used as it is: preset extras such as
  ``output_router_logits`` are not added (set them under ``config``). ``config: PATH`` (a
  string) is accepted as a short form of ``config_file: PATH`` with no overrides.

``config`` (a mapping) overrides fields of either, before the config is built (a shorter
``num_hidden_layers`` also shortens a file's ``layer_types``).

``train.compile: true`` binds with ``veomni_ops.apply(model, ops, compile=True)`` (``auto``
then picks only kernels that support torch.compile) and wraps the model in
``torch.compile``. Tokens/s is the median over the steady steps: the first step (allocation,
autotuning) is excluded, and the first two when compiled (compilation); the spread
(p25..p75, min..max) of the same steps is shown beside it.

Comparisons, each run in its own process (so its peak memory is its own), all from the first
config's seed (so the same data):

* ``--compare OTHER``: a second job YAML.
* ``--baseline NAME`` (repeatable): the first config's job (model, data, steps, dtype, batch),
  without veomni-ops:
  ``transformers`` (plain transformers, ``attn_implementation="sdpa"``),
  ``transformers+compile`` (the same under ``torch.compile``), ``liger`` (Liger-Kernel's own
  monkey patch for the model type, on the instance; needs liger-kernel and a GPU).

After comparing, every run's losses are checked: each must be finite, and at every step
``|loss - loss of the first run| <= TOL * max(|loss of the first run|, 1)``. TOL is
``--loss-tol``, by default 1e-3 when every run is float32/float64 and 2e-2 when any run is
bfloat16/float16 (see ``default_loss_tol``). Any failure prints FAIL and exits 1 (a single run
is checked for non-finite losses only). ``--steps N``
overrides train.steps of every run; ``--json`` prints everything as JSON on stdout;
``--plot PNG`` draws the loss curves and tokens/s of every run (needs matplotlib).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
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

#: baseline name -> what it is. Each runs the first config's job with no veomni-ops at all.
BASELINES: dict[str, str] = {
    "transformers": "plain transformers, attn_implementation sdpa, no veomni-ops",
    "transformers+compile": "plain transformers under torch.compile, attn_implementation sdpa, no veomni-ops",
    "liger": "Liger-Kernel's own monkey patch for the model type (its defaults), attn_implementation sdpa",
}

#: Default relative loss tolerances (see ``default_loss_tol``).
LOSS_TOL_FP32 = 1e-3
LOSS_TOL_LOW_PRECISION = 2e-2
LOW_PRECISION_DTYPES = ("bfloat16", "float16", "half")


class TrainConfigError(ValueError):
    """A job YAML or a train option is malformed or cannot run here (the CLI reports it and exits 1)."""


class RunFailed(RuntimeError):
    """A training run in a child process failed (its output is above)."""


# ----------------------------------------------------------------------------------------
# The job
# ----------------------------------------------------------------------------------------


def load_job(path: str) -> dict[str, Any]:
    import yaml

    from .config import ConfigError, OpsConfig

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
    unknown_top = set(data) - {"model", "train", "parallel"}
    if unknown_top:
        raise TrainConfigError(f"{path}: unknown section(s): {', '.join(sorted(unknown_top))}; known: model, train, "
                               "parallel")
    return {"path": path, "architecture": arch, "size": size, "config_file": config_file, "ops": ops,
            "overrides": overrides, "train": train, "parallel": _load_parallel(path, data.get("parallel"))}


def _load_parallel(path: str, section: Any):
    """The job's ``parallel:`` layout (:class:`veomni_ops.parallel.ParallelLayout`), or None."""
    if section is None:
        return None
    from .parallel.layout import ParallelConfigError, ParallelLayout

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
    """The job's model with random weights from ``train.seed``, built in float32 on ``device``."""
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


def synthetic_batches(vocab: int, batch: int, seq: int, steps: int, seed: int, device):
    """Learnable synthetic data: arithmetic progressions mod vocab with a random start and stride."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        stride = torch.randint(1, 8, (batch, 1), generator=g)
        ids = (start + stride * torch.arange(seq)) % vocab
        yield ids.to(device)


def _resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def _peak_bytes(device: str) -> tuple[int, str]:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(), "peak allocated"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak RSS"


# ----------------------------------------------------------------------------------------
# Baselines
# ----------------------------------------------------------------------------------------


def _liger_version() -> str | None:
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
    if _liger_version() is None:
        raise TrainConfigError("--baseline liger needs Liger-Kernel, which is not installed here: "
                               "pip install liger-kernel (its kernels need a GPU)")
    device = device or _resolve_device(job["train"]["device"])
    if device.split(":")[0] == "cpu":
        raise TrainConfigError(f"--baseline liger: Liger-Kernel's kernels are Triton GPU kernels and {job['path']} "
                               "trains on cpu; run it on a GPU (train.device: cuda or auto) or drop this baseline")


def _apply_liger(model) -> str:
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
        raise TrainConfigError(f"--baseline liger: Liger-Kernel {_liger_version()} has no patch for model type "
                               f"{model_type!r}; drop this baseline for this model")
    fn(model=model)
    return fn.__name__


def _compile_apply(apply):
    """``apply`` with compile=True, refused clearly where this veomni-ops has no such keyword."""
    import inspect

    if "compile" not in inspect.signature(apply).parameters:
        raise TrainConfigError("train.compile: true needs veomni_ops.apply(model, ops, compile=True), which this "
                               "veomni-ops does not have; upgrade veomni-ops or set train.compile: false")
    return apply


# ----------------------------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------------------------


def rate_stats(rates: list[float], warmup: int) -> dict[str, Any]:
    """Median and spread of per-step tokens/s over the steps after ``warmup`` (all, if none is left)."""
    steady = rates[warmup:] if len(rates) > warmup else list(rates)
    first = warmup + 1 if len(rates) > warmup else 1
    if len(steady) >= 2:
        p25, _, p75 = statistics.quantiles(steady, n=4, method="inclusive")
    else:
        p25 = p75 = steady[0] if steady else float("nan")
    return {
        "tokens_per_s": statistics.median(steady) if steady else float("nan"),
        "tokens_per_s_p25": p25, "tokens_per_s_p75": p75,
        "tokens_per_s_min": min(steady, default=float("nan")), "tokens_per_s_max": max(steady, default=float("nan")),
        "warmup_steps": warmup if len(rates) > warmup else 0, "timed_steps": [first, len(rates)],
    }


def _plan_device(device: str):
    """The device to resolve the plan for: the detected one, unless the job trains on the CPU of a GPU machine."""
    from .device import DeviceInfo, current_device

    if device.split(":")[0] == "cpu" and current_device().type != "cpu":
        return DeviceInfo("cpu", None, "cpu")
    return None


def _prepare(job: dict[str, Any], baseline: str | None, device: str, dtype, out, rt=None) -> tuple[Any, dict[str, Any]]:
    """Build the model for this run, bind or patch it, compile it where asked. Returns (model, facts).
    ``rt``: the parallel runtime of this rank (the plan is resolved and wrapped for its layout, then FSDP2)."""
    import torch
    import transformers

    compiled = bool(job["train"]["compile"]) if baseline is None else baseline.endswith("+compile")
    if baseline is None:
        from .binding import apply

        if compiled:
            _compile_apply(apply)
        model = build_model(job, device).to(dtype=dtype)
        kw: dict[str, Any] = {"device": _plan_device(device)}
        if rt is not None:
            rt.prepare(model)
            kw["parallel"] = rt
        binding = apply(model, job["ops"], compile=True, **kw) if compiled else apply(model, job["ops"], **kw)
        print(binding.plan.table(), file=out)
        print(f"bound: {json.dumps(binding.summary())}", file=out)
        facts: dict[str, Any] = {"plan": binding.plan.to_dict(), "bound": binding.summary()}
        if rt is not None:
            print(rt.describe(), file=out)
            model = rt.parallelize(model, binding, dtype)
            facts["parallel"] = rt.to_dict()
    else:
        model = build_model(job, device, attn_implementation="sdpa").to(dtype=dtype)
        facts = {"plan": None, "bound": None, "baseline_about": BASELINES[baseline],
                 "transformers_version": transformers.__version__}
        if baseline == "liger":
            facts["liger_patch"] = _apply_liger(model)
            facts["liger_version"] = _liger_version()
        print(f"baseline {baseline}: {BASELINES[baseline]} (transformers {transformers.__version__}"
              + (f", liger-kernel {facts['liger_version']}: {facts['liger_patch']}" if baseline == "liger" else "")
              + ")", file=out)
    if compiled:
        model = torch.compile(model)
        print("torch.compile: the first steps include compilation", file=out)
    facts["compiled"] = compiled
    return model, facts


def _rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def is_parallel(job: dict[str, Any]) -> bool:
    """Does this job run the parallel path: launched by torchrun (even with one process: the
    world-size-1 NCCL/gloo path), or with a non-trivial ``parallel:`` layout?"""
    from .parallel.layout import world_from_env

    under_torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    return under_torchrun or world_from_env() > 1 or (job.get("parallel") is not None
                                                      and not job["parallel"].is_trivial)


def train_one(job: dict[str, Any], out=sys.stderr, baseline: str | None = None) -> dict[str, Any]:
    if baseline is None and is_parallel(job):
        return _train_parallel(job, out)
    return _train(job, out, baseline)


def _train_parallel(job: dict[str, Any], out) -> dict[str, Any]:
    """This rank's part of a parallel job (``veomni_ops.parallel``); only rank 0 prints."""
    from .parallel import ParallelLayout, ParallelRuntime
    from .parallel.layout import world_from_env

    t = job["train"]
    if t["compile"]:
        raise TrainConfigError(f"{job['path']}: train.compile with a parallel layout is not supported yet "
                               "(FSDP2/Ulysses/EP run eagerly here); set train.compile: false")
    layout = job.get("parallel") or ParallelLayout.data_parallel(world_from_env())
    layout.check_world(world_from_env())  # every rank refuses the same way, before any collective
    layout.check_model(build_config(job))
    layout.check_batch(int(t["batch_size"]))
    with ParallelRuntime.from_env(layout, _resolve_device(t["device"])) as rt:
        if rt.rank != 0:
            with open(os.devnull, "w") as quiet:
                return _train(job, quiet, None, rt)
        return _train(job, out, None, rt)


def _train(job: dict[str, Any], out, baseline: str | None = None, rt=None) -> dict[str, Any]:
    import torch

    t = job["train"]
    device = rt.device if rt is not None else _resolve_device(t["device"])
    if baseline is not None:
        check_baseline(baseline, job, device)
    dtype = getattr(torch, t["dtype"])
    model, facts = _prepare(job, baseline, device, dtype, out, rt)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=float(t["lr"]))
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    steps, b, s = int(t["steps"]), int(t["batch_size"]), int(t["seq_len"])
    warmup = 2 if facts["compiled"] else 1  # allocation and autotuning; compilation too when compiled
    losses, rates = [], []
    width = 20
    for i, ids in enumerate(synthetic_batches(model.config.vocab_size, b, s, steps, t["seed"], device)):
        t0 = time.perf_counter()
        # Under a parallel layout each rank trains its rows and sequence slice of the same global batch.
        outp = model(input_ids=ids, labels=ids) if rt is None else model(**rt.shard_batch(ids))
        outp.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = float(outp.loss.detach()) if rt is None else rt.global_loss(outp.loss)  # the one host sync per step
        dt = time.perf_counter() - t0
        rate = b * s / dt
        losses.append(loss)
        rates.append(rate)
        peak, what = _peak_bytes(device)
        done = (i + 1) * width // steps
        print(f"[{'#' * done}{'.' * (width - done)}] step {i + 1:>3}/{steps}  loss {loss:8.4f}  "
              f"{rate:10.0f} tok/s  {what} {peak / 2**30:6.2f} GiB" + ("  (warm-up)" if i < warmup else ""),
              file=out, flush=True)
    peak, what = _peak_bytes(device)
    stats = rate_stats(rates, warmup)
    result = {
        "run": baseline or os.path.basename(job["path"]), "config": job["path"], "baseline": baseline,
        "architecture": job["architecture"], "size": job["size"], "config_file": job.get("config_file"),
        "device": device, "dtype": t["dtype"], "steps": steps, "batch_size": b, "seq_len": s, "seed": t["seed"],
        **facts, "losses": losses, "final_loss": losses[-1] if losses else float("nan"),
        **stats, "step_tokens_per_s": rates, "peak_gib": peak / 2**30, "peak_kind": what,
    }
    lo, hi = stats["timed_steps"]
    print(f"done: final loss {result['final_loss']:.4f}, median {stats['tokens_per_s']:.0f} tok/s over steps "
          f"{lo}..{hi} ({stats['warmup_steps']} warm-up step(s) excluded; p25..p75 {stats['tokens_per_s_p25']:.0f}.."
          f"{stats['tokens_per_s_p75']:.0f}, min..max {stats['tokens_per_s_min']:.0f}..{stats['tokens_per_s_max']:.0f})"
          f", {what} {result['peak_gib']:.2f} GiB", file=out)
    return result


def _run_child(path: str, seed: int | None, steps: int | None = None, baseline: str | None = None) -> dict[str, Any]:
    """Train ``path`` (as ``baseline`` if given) in a fresh process so its peak memory is its own."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as fh:
        out_path = fh.name
    cmd = [sys.executable, "-m", "veomni_ops.train", path, "--result-file", out_path]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    if baseline is not None:
        cmd += ["--as-baseline", baseline]
    try:
        try:
            sink: int | None = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):  # a stream with no descriptor (captured): pass it through
            sink = None
        proc: subprocess.CompletedProcess[Any]
        if sink is not None:
            proc = subprocess.run(cmd, stdout=sink, stderr=sink)
        else:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            sys.stderr.write(proc.stdout)
        what = f"baseline {baseline} of {path}" if baseline else path
        if proc.returncode != 0:
            # The child wrote why into the result file (_run_as_child); a crash that could not is told by its exit.
            why = _child_error(out_path)
            raise RunFailed(f"training {what} failed: {why}" if why else
                            f"training {what} failed (exit {proc.returncode}); see the output above")
        with open(out_path) as fh:
            return json.load(fh)
    finally:
        os.unlink(out_path)


def _child_error(path: str) -> str | None:
    """The error a failed child run wrote into its result file, if it could."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data.get("error") if isinstance(data, dict) and isinstance(data.get("error"), str) else None


# ----------------------------------------------------------------------------------------
# Comparing runs
# ----------------------------------------------------------------------------------------


def default_loss_tol(runs: list[dict[str, Any]]) -> float:
    """1e-3 when every run is float32/float64, 2e-2 when any is bfloat16/float16.

    Runs of the same math from the same seed and data differ only by rounding, which AdamW
    does not amplify much over tens of steps. In float32 on a CPU the demo's kernels stay
    within 1-2 float32 ulps of the loss (about 1e-7 relative, 60 steps, dense and MoE); on a
    GPU, Triton's ``tl.dot`` rounds float32 inputs to TF32 (about 5e-4 per product) unless a
    kernel asks otherwise, so 1e-3 is the tightest bound that such kernels still pass, and it
    still fails a kernel that changes the math (a wrong norm offset, rotary layout or lr moves
    the loss by far more). It cannot see changes below 0.1% of the loss (a dropped
    load-balancing term with coefficient 1e-3, say): pass a smaller ``--loss-tol`` for that.
    bfloat16 keeps 8 bits (2**-8 = 4e-3 relative per value); 30 bf16 steps on an H100 differed
    by up to 3.1e-3 relative (Liger vs eager; 1.4e-3 FA4 vs SDPA, 7.7e-4 Triton MoE vs eager,
    benchmarks/results/h100-2026-11-21/), so 2e-2 leaves about 6x headroom.
    """
    low = any(str(r.get("dtype")) in LOW_PRECISION_DTYPES for r in runs)
    return LOSS_TOL_LOW_PRECISION if low else LOSS_TOL_FP32


def tolerance_rule(ref: str, tol: float, source: str) -> str:
    return f"every loss finite, and |loss - loss of {ref}| <= {tol:g} x max(|loss of {ref}|, 1) at every step ({source})"


def check_run(ref: dict[str, Any], run: dict[str, Any], tol: float) -> dict[str, Any]:
    """Is every loss of ``run`` finite, and within ``tol`` (relative, floor 1) of ``ref`` at every step?"""
    nonfinite = [[i + 1, repr(x)] for i, x in enumerate(run["losses"]) if not math.isfinite(x)]
    n = min(len(ref["losses"]), len(run["losses"]))
    max_diff = max_step = worst = None
    for i in range(n):
        a, b = ref["losses"][i], run["losses"][i]
        if not (math.isfinite(a) and math.isfinite(b)):
            continue
        d, allowed = abs(b - a), tol * max(abs(a), 1.0)
        if max_diff is None or d > max_diff:
            max_diff, max_step = d, i + 1
        if worst is None or d / allowed > worst[2] / worst[3]:
            worst = (i + 1, a, d, allowed)
    same = run is ref
    within = worst is None or worst[2] <= worst[3]
    res: dict[str, Any] = {
        "run": run["run"], "reference": ref["run"], "passed": not nonfinite and (same or within),
        "nonfinite_steps": nonfinite, "steps_compared": n,
        "max_loss_diff": None if same else max_diff, "max_loss_diff_step": None if same else max_step,
        "worst_step": None if same or worst is None else worst[0],
        "worst_diff": None if same or worst is None else worst[2],
        "worst_allowed": None if same or worst is None else worst[3],
    }
    if nonfinite:
        shown = ", ".join(f"step {s}: {v}" for s, v in nonfinite[:3]) + (", ..." if len(nonfinite) > 3 else "")
        res["message"] = f"{len(nonfinite)} loss(es) not finite ({shown})"
    elif same:
        res["message"] = "every loss finite (the reference)"
    elif worst is None:
        res["message"] = "no step to compare"
    else:
        verb = "within" if within else "OVER"
        res["message"] = (f"largest |loss diff| {max_diff:.3g} (step {max_step}); at step {worst[0]} "
                          f"{worst[2]:.3g} is {verb} the {worst[3]:.3g} allowed ({worst[2] / worst[3]:.2g} of it)")
    if len(ref["losses"]) != len(run["losses"]) and not same:
        res["message"] += f"; only the first {n} steps compared ({len(ref['losses'])} vs {len(run['losses'])} steps)"
    return res


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The two-run summary ``--compare`` has always given (kept in --json as "compare")."""
    n = min(len(a["losses"]), len(b["losses"]))
    diffs = [abs(x - y) for x, y in zip(a["losses"][:n], b["losses"][:n])]
    finite = [d for d in diffs if math.isfinite(d)]
    return {
        "max_loss_diff": max(finite) if finite else None,
        "max_loss_diff_step": (diffs.index(max(finite)) + 1) if finite else None,
        "speed_ratio": a["tokens_per_s"] / b["tokens_per_s"],
        "peak_memory_ratio": a["peak_gib"] / b["peak_gib"] if b["peak_gib"] else None,
    }


def _ratio(x: float) -> str:
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def _iqrs_overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["tokens_per_s_p25"] <= b["tokens_per_s_p75"] and b["tokens_per_s_p25"] <= a["tokens_per_s_p75"]


def report(runs: list[dict[str, Any]], refs: list[int], loss_tol: float | None) -> dict[str, Any]:
    """Checks and ratios of ``runs`` (the first is the loss reference; ``refs`` index the speed references)."""
    tol = default_loss_tol(runs) if loss_tol is None else loss_tol
    source = "--loss-tol" if loss_tol is not None else (
        "default for bfloat16/float16 runs" if tol == LOSS_TOL_LOW_PRECISION else "default for float32 runs")
    checks = [check_run(runs[0], r, tol) for r in runs]
    ratios = {
        runs[j]["run"]: [r["tokens_per_s"] / runs[j]["tokens_per_s"] if runs[j]["tokens_per_s"] else None for r in runs]
        for j in refs
    }
    return {
        "reference": runs[0]["run"], "loss_tol": tol, "loss_tol_source": source,
        "rule": tolerance_rule(runs[0]["run"], tol, source), "checks": checks,
        "passed": all(c["passed"] for c in checks),
        "speed_ratio_vs": ratios, "cpu_timing": any(r["device"].startswith("cpu") for r in runs),
        "peak_memory_ratio_vs": {
            runs[j]["run"]: [r["peak_gib"] / runs[j]["peak_gib"] if runs[j]["peak_gib"] else None for r in runs]
            for j in refs
        },
    }


def print_report(runs: list[dict[str, Any]], rep: dict[str, Any], out) -> None:
    refs = list(rep["speed_ratio_vs"])
    noisy = " (CPU timing: noisy)" if rep["cpu_timing"] else ""
    print(f"\n== comparison (same seed, data and steps); tok/s: median [p25..p75] over steady steps{noisy}", file=out)
    name_w = max(len("run"), *(len(r["run"]) for r in runs)) + 2
    head = (f"  {'run':<{name_w}}{'tok/s':>10} {'[p25..p75]':<20}{'warm-up':>8}{'peak GiB':>10}{'final loss':>12}"
            f"{'max |dloss|':>13}")
    head += "".join(f"{'vs ' + r:>{max(10, len(r) + 5)}}" for r in refs)
    print(head, file=out)
    checks = {c["run"]: c for c in rep["checks"]}
    for i, r in enumerate(runs):
        spread = f"[{r['tokens_per_s_p25']:.0f}..{r['tokens_per_s_p75']:.0f}]"
        diff = checks[r["run"]]["max_loss_diff"]
        line = (f"  {r['run']:<{name_w}}{r['tokens_per_s']:>10.0f} {spread:<20}{r['warmup_steps']:>8}"
                f"{r['peak_gib']:>10.2f}{r['final_loss']:>12.4f}{'-' if diff is None else f'{diff:.3g}':>13}")
        for ref in refs:
            ratio = rep["speed_ratio_vs"][ref][i]
            line += f"{'-' if ratio is None else _ratio(ratio):>{max(10, len(ref) + 5)}}"
        print(line, file=out)
    first = runs[0]
    for ref in refs:
        j = next(k for k, r in enumerate(runs) if r["run"] == ref)
        ratio = rep["speed_ratio_vs"][ref][0]
        if ratio is None or j == 0:
            continue
        notes = ["of medians"] + (["CPU timing: noisy"] if rep["cpu_timing"] else [])
        if _iqrs_overlap(first, runs[j]):
            notes.append("their p25..p75 ranges overlap: no clear difference")
        print(f"  speed ratio {first['run']} / {ref}: {_ratio(ratio)} ({'; '.join(notes)})", file=out)
        mem = rep["peak_memory_ratio_vs"][ref][0]
        if mem is not None:
            print(f"  peak memory ratio {first['run']} / {ref}: {mem:.2f}x ({first['peak_kind']})", file=out)
    print(f"  loss check: {rep['rule']}", file=out)
    for c in rep["checks"]:
        print(f"  {'PASS' if c['passed'] else 'FAIL'} {c['run']}: {c['message']}", file=out)
    print(("PASS" if rep["passed"] else "FAIL") + f": {sum(c['passed'] for c in rep['checks'])}/{len(rep['checks'])} "
          "runs pass the loss check", file=out)


def plot(runs: list[dict[str, Any]], rep: dict[str, Any], path: str) -> None:
    """Loss curves of every run, each run's loss difference from the first, and each run's tokens/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_diff, ax_rate) = plt.subplots(1, 3, figsize=(17, 4.8))
    styles = ["-", "--", ":", "-."]
    ref = runs[0]["losses"]
    for k, r in enumerate(runs):
        losses = [x if math.isfinite(x) else float("nan") for x in r["losses"]]
        steps = range(1, len(losses) + 1)
        ax_loss.plot(steps, losses, styles[k % 4], label=r["run"], linewidth=1.4)
        if k:
            diff = [abs(x - y) if math.isfinite(x - y) and x != y else float("nan") for x, y in zip(losses, ref)]
            ax_diff.plot(range(1, len(diff) + 1), diff, styles[k % 4], color=f"C{k}", label=r["run"], marker=".")
    ax_loss.set(xlabel="step", ylabel="loss", title="loss (same seed and data)")
    ax_loss.legend(fontsize=8)
    allowed = [rep["loss_tol"] * max(abs(x), 1.0) if math.isfinite(x) else float("nan") for x in ref]
    ax_diff.plot(range(1, len(allowed) + 1), allowed, color="red", linewidth=1, label=f"allowed ({rep['loss_tol']:g} rel.)")
    ax_diff.set_yscale("log")
    ax_diff.set(xlabel="step", ylabel=f"|loss - loss of {runs[0]['run']}|", title="loss difference from the first run")
    ax_diff.legend(fontsize=8)
    xs = list(range(len(runs)))
    med = [r["tokens_per_s"] for r in runs]
    err = [[m - r["tokens_per_s_p25"] for m, r in zip(med, runs)], [r["tokens_per_s_p75"] - m for m, r in zip(med, runs)]]
    ax_rate.bar(xs, med, yerr=err, capsize=5, color=[f"C{k}" for k in xs], alpha=0.8)
    ax_rate.set_xticks(xs)
    ax_rate.set_xticklabels([r["run"] for r in runs], rotation=20, ha="right", fontsize=8)
    ax_rate.set_ylabel("tokens/s (median; whiskers p25..p75)")
    warm = "/".join(map(str, sorted({r["warmup_steps"] for r in runs})))
    ax_rate.set_title(f"tokens/s, {warm} warm-up step(s) excluded" + ("\n(CPU timing: noisy)" if rep["cpu_timing"] else ""))
    r0 = runs[0]
    fig.suptitle(f"{r0['architecture']}  {r0['dtype']}  batch {r0['batch_size']} x seq {r0['seq_len']}  "
                 f"{r0['steps']} steps on {r0['device']}  loss check: {'PASS' if rep['passed'] else 'FAIL'}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _finite_json(obj: Any) -> Any:
    """``obj`` with NaN and infinities as null, so that --json prints strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_json(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of steps >= 1, got {text!r}")
    return n


def _positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not (x > 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"expected a relative tolerance > 0 (e.g. 1e-3), got {text!r}")
    return x


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="job YAML (model: architecture and size, or config_file; ops_implementation; "
                                  "train: ...); see examples/")
    p.add_argument("--compare", metavar="OTHER", help="train this job YAML too, same seed and data, and compare")
    p.add_argument("--baseline", action="append", metavar="NAME", choices=list(BASELINES), default=[],
                   help="also train CONFIG's job without veomni-ops, as NAME (repeatable): "
                        + "; ".join(f"{k}: {v}" for k, v in BASELINES.items()))
    p.add_argument("--loss-tol", type=_positive_float, metavar="TOL",
                   help="relative loss tolerance of the comparison: a run FAILs (exit 1) when |loss - loss of the "
                        "first run| > TOL x max(|loss of the first run|, 1) at any step, or when any loss is not "
                        f"finite. Default {LOSS_TOL_FP32:g} when every run is float32, {LOSS_TOL_LOW_PRECISION:g} "
                        "when any run is bfloat16/float16")
    p.add_argument("--steps", type=_positive_int, metavar="N", help="override train.steps (of every run)")
    p.add_argument("--seed", type=int, help="override train.seed (of every run)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout (progress on stderr)")
    p.add_argument("--plot", metavar="PATH.png", help="draw every run's loss curve and tokens/s into a PNG "
                                                      "(needs matplotlib)")
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    p.add_argument("--as-baseline", choices=list(BASELINES), help=argparse.SUPPRESS)


def _load(path: str, args: argparse.Namespace) -> dict[str, Any]:
    job = load_job(path)
    if args.seed is not None:
        job["train"]["seed"] = args.seed
    if args.steps is not None:
        job["train"]["steps"] = args.steps
    return job


def _run_as_child(args: argparse.Namespace) -> int:
    """Train one job and write its result, or ``{"error": ..., "kind": ...}``, to ``--result-file``."""
    from .binding import BindingError
    from .cli import ENV_TRACE, error_text
    from .config import ConfigError
    from .device import DeviceError
    from .discovery import PluginLoadError
    from .resolve import ResolutionError

    try:
        res = train_one(_load(args.config, args), baseline=args.as_baseline)
    except Exception as e:
        refusal = isinstance(e, (ConfigError, TrainConfigError, FileNotFoundError, ResolutionError, BindingError,
                                 DeviceError, PluginLoadError))
        message = error_text(e, refusal=refusal)
        if os.environ.get(ENV_TRACE, "") not in ("", "0"):
            import traceback

            traceback.print_exc()
        elif not refusal:
            message += f" (set {ENV_TRACE}=1 for the traceback)"
        with open(args.result_file, "w") as fh:
            json.dump({"error": message, "kind": type(e).__name__}, fh)
        return 1
    with open(args.result_file, "w") as fh:
        json.dump(res, fh)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.result_file:  # child mode: a failure is written for the parent to report, in one line
        return _run_as_child(args)
    job = _load(args.config, args)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise TrainConfigError("--plot needs matplotlib, which is not installed here: pip install matplotlib")
    for name in args.baseline:
        check_baseline(name, job)
    jobs = [job] + ([_load(args.compare, args)] if args.compare else [])  # fail fast on a bad second config
    if any(j["train"]["compile"] for j in jobs):
        from .binding import apply

        _compile_apply(apply)
    human = sys.stderr if args.json else sys.stdout
    seed = job["train"]["seed"]
    if is_parallel(job):  # one rank of a parallel job (torchrun): rank 0 reports
        if args.compare or args.baseline:
            raise TrainConfigError("--compare and --baseline run each job in a process of its own; run them without "
                                   "torchrun (or compare the losses of separate runs)")
        from .parallel import ParallelFailure

        try:
            runs = [train_one(job, out=human)]
        except ParallelFailure as e:
            raise RunFailed(str(e)) from e
        if _rank() != 0:
            return 0
    elif not args.compare and not args.baseline:
        runs = [train_one(job, out=human)]
    else:
        specs: list[tuple[str, str | None, str]] = [(args.config, None, args.config)]
        if args.compare:
            specs.append((args.compare, None, args.compare))
        specs += [(args.config, name, f"baseline {name} ({BASELINES[name]})") for name in args.baseline]
        runs = []
        for path, baseline, title in specs:
            print(f"== {title}", file=human, flush=True)
            runs.append(_run_child(path, seed, args.steps, baseline))
    rep = report(runs, list(range(1, len(runs))), args.loss_tol)
    if args.plot:
        plot(runs, rep, args.plot)
        print(f"plot: {args.plot}", file=human)
    if args.json:
        if len(runs) == 1:
            out: dict[str, Any] = {**runs[0], "check": rep["checks"][0], "passed": rep["passed"]}
        else:
            out = {"runs": runs, **rep}
            if args.compare:  # the keys --compare --json has always had
                out.update(a=runs[0], b=runs[1], compare=compare(runs[0], runs[1]))
        print(json.dumps(_finite_json(out), indent=2))
    elif len(runs) > 1:
        print_report(runs, rep, human)
    if not rep["passed"]:
        failed = [c for c in rep["checks"] if not c["passed"]]
        if len(runs) == 1 and not args.json:
            print(f"FAIL {failed[0]['run']}: {failed[0]['message']}", file=human)
        print(f"veomni-ops train: FAIL: {'; '.join(c['run'] + ': ' + c['message'] for c in failed)}. Rule: "
              f"{rep['rule']}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    from .cli import main as cli_main

    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
