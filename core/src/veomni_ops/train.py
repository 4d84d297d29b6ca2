"""``veomni-ops train CONFIG.yaml [--compare OTHER.yaml] [--json]``: the main job.

Builds a transformers model from an architecture and a size preset (random weights, no
download), resolves and prints the kernel plan, binds it, and trains N steps of AdamW on
synthetic token data. ``--compare`` trains a second config from the same seed and data
(each run in its own process, so peak memory is its own) and reports the largest loss
difference and the ratios of speed and peak memory.

    model:
      architecture: qwen3          # llama, qwen2, qwen3, qwen3_moe, qwen3_5 (offset norm, partial rotary)
      size: tiny                   # tiny, small
      ops_implementation: {rms_norm_implementation: auto, ...}
    train: {batch_size: 4, seq_len: 128, steps: 20, lr: 1.0e-3, dtype: float32, device: auto, seed: 0}
"""

from __future__ import annotations

import argparse
import json
import os
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
                                      device="auto", seed=0)


class TrainConfigError(ValueError):
    """A job YAML is malformed (the CLI reports it and exits 1)."""


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
        raise TrainConfigError(f"{path}: expected a mapping with a 'model:' section (architecture, size, ops_implementation)")
    model = dict(data["model"])
    arch = str(model.pop("architecture", "")).lower()
    if arch not in ARCHITECTURES:
        raise TrainConfigError(f"{path}: model.architecture {arch!r} is not one of: {', '.join(ARCHITECTURES)}")
    size = str(model.pop("size", "tiny")).lower()
    if size not in SIZES:
        raise TrainConfigError(f"{path}: model.size {size!r} is not one of: {', '.join(SIZES)}")
    ops = OpsConfig.from_dict(model.pop("ops_implementation", None) or {})
    overrides = model.pop("config", {}) or {}
    if model:
        raise TrainConfigError(f"{path}: unknown model field(s): {', '.join(model)}; known: architecture, size, "
                               "ops_implementation, config")
    train = dict(TRAIN_DEFAULTS)
    extra = set(data.get("train") or {}) - set(TRAIN_DEFAULTS)
    if extra:
        raise TrainConfigError(f"{path}: unknown train field(s): {', '.join(sorted(extra))}; known: {', '.join(TRAIN_DEFAULTS)}")
    train.update(data.get("train") or {})
    unknown_top = set(data) - {"model", "train"}
    if unknown_top:
        raise TrainConfigError(f"{path}: unknown section(s): {', '.join(sorted(unknown_top))}; known: model, train")
    return {"path": path, "architecture": arch, "size": size, "ops": ops, "overrides": overrides, "train": train}


def build_model(job: dict[str, Any]):
    import torch
    import transformers

    cfg_name, model_name, extra = ARCHITECTURES[job["architecture"]]
    cfg_cls = getattr(transformers, cfg_name, None)
    model_cls = getattr(transformers, model_name, None)
    if cfg_cls is None or model_cls is None:
        raise TrainConfigError(f"transformers {transformers.__version__} has no {model_name}; upgrade transformers")
    kwargs = {**SIZES[job["size"]], **extra, **job["overrides"]}
    if job["architecture"] == "qwen3_5":
        kwargs.setdefault("layer_types", ["full_attention"] * kwargs["num_hidden_layers"])
    cfg = cfg_cls(**kwargs)
    torch.manual_seed(job["train"]["seed"])
    model = model_cls(cfg)
    return model


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


def train_one(job: dict[str, Any], out=sys.stderr) -> dict[str, Any]:
    import torch

    from .binding import apply

    t = job["train"]
    device = _resolve_device(t["device"])
    dtype = getattr(torch, t["dtype"])
    model = build_model(job).to(device=device, dtype=dtype)
    binding = apply(model, job["ops"])
    print(binding.plan.table(), file=out)
    print(f"bound: {json.dumps(binding.summary())}", file=out)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=float(t["lr"]))
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    steps, b, s = int(t["steps"]), int(t["batch_size"]), int(t["seq_len"])
    losses, rates = [], []
    width = 20
    for i, ids in enumerate(synthetic_batches(model.config.vocab_size, b, s, steps, t["seed"], device)):
        t0 = time.perf_counter()
        outp = model(input_ids=ids, labels=ids)
        outp.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = float(outp.loss.detach())  # the one host sync per step
        dt = time.perf_counter() - t0
        rate = b * s / dt
        losses.append(loss)
        rates.append(rate)
        peak, what = _peak_bytes(device)
        done = (i + 1) * width // steps
        print(f"[{'#' * done}{'.' * (width - done)}] step {i + 1:>3}/{steps}  loss {loss:8.4f}  "
              f"{rate:10.0f} tok/s  {what} {peak / 2**30:6.2f} GiB", file=out, flush=True)
    peak, what = _peak_bytes(device)
    steady = rates[1:] or rates  # the first step includes warm-up (allocation, compilation)
    steady_sorted = sorted(steady)
    result = {
        "config": job["path"], "architecture": job["architecture"], "size": job["size"], "device": device,
        "dtype": t["dtype"], "steps": steps, "batch_size": b, "seq_len": s,
        "plan": binding.plan.to_dict(), "bound": binding.summary(), "losses": losses,
        "final_loss": losses[-1], "tokens_per_s": steady_sorted[len(steady_sorted) // 2],
        "peak_gib": peak / 2**30, "peak_kind": what,
    }
    print(f"done: final loss {result['final_loss']:.4f}, median {result['tokens_per_s']:.0f} tok/s "
          f"(steps 2..{steps}), {what} {result['peak_gib']:.2f} GiB", file=out)
    return result


def _run_child(path: str, seed: int | None) -> dict[str, Any]:
    """Train ``path`` in a fresh process so its peak memory is its own."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as fh:
        out_path = fh.name
    cmd = [sys.executable, "-m", "veomni_ops.train", path, "--result-file", out_path]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"training {path} failed (exit {proc.returncode}); see the output above")
    with open(out_path) as fh:
        res = json.load(fh)
    os.unlink(out_path)
    return res


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    n = min(len(a["losses"]), len(b["losses"]))
    diffs = [abs(x - y) for x, y in zip(a["losses"][:n], b["losses"][:n])]
    return {
        "max_loss_diff": max(diffs) if diffs else None,
        "max_loss_diff_step": (diffs.index(max(diffs)) + 1) if diffs else None,
        "speed_ratio": a["tokens_per_s"] / b["tokens_per_s"],
        "peak_memory_ratio": a["peak_gib"] / b["peak_gib"] if b["peak_gib"] else None,
    }


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="job YAML (model: architecture, size, ops_implementation; train: ...)")
    p.add_argument("--compare", metavar="OTHER", help="train this config too, same seed and data, and compare")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout (progress on stderr)")
    p.add_argument("--seed", type=int, help="override train.seed")
    p.add_argument("--result-file", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    job = load_job(args.config)
    if args.seed is not None:
        job["train"]["seed"] = args.seed
    if args.result_file:  # child mode
        res = train_one(job)
        with open(args.result_file, "w") as fh:
            json.dump(res, fh)
        return 0
    human = sys.stderr if args.json else sys.stdout
    if not args.compare:
        res = train_one(job, out=human)
        if args.json:
            print(json.dumps(res, indent=2))
        return 0
    load_job(args.compare)  # fail fast on a bad second config
    seed = job["train"]["seed"]
    print(f"== {args.config}", file=human, flush=True)
    a = _run_child(args.config, seed)
    print(f"== {args.compare}", file=human, flush=True)
    b = _run_child(args.compare, seed)
    cmp = compare(a, b)
    if args.json:
        print(json.dumps({"a": a, "b": b, "compare": cmp}, indent=2))
        return 0
    print("\n== comparison (same seed and data)", file=human)
    print(f"  {'':<28}{'tok/s':>12}{'peak GiB':>10}{'final loss':>12}", file=human)
    for r in (a, b):
        print(f"  {os.path.basename(r['config']):<28}{r['tokens_per_s']:>12.0f}{r['peak_gib']:>10.2f}"
              f"{r['final_loss']:>12.4f}", file=human)
    print(f"  largest loss difference: {cmp['max_loss_diff']:.3g} (step {cmp['max_loss_diff_step']})", file=human)
    print(f"  speed ratio {os.path.basename(a['config'])} / {os.path.basename(b['config'])}: {cmp['speed_ratio']:.2f}x",
          file=human)
    if cmp["peak_memory_ratio"] is not None:
        print(f"  peak memory ratio: {cmp['peak_memory_ratio']:.2f}x ({a['peak_kind']})", file=human)
    return 0


def main(argv=None) -> int:
    from .cli import main as cli_main

    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
