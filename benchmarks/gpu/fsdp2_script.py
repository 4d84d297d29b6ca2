"""The hand-written FSDP2 script of issue 23: what a user writes instead of a `parallel:` section.

A transformers model with float32 master weights, veomni-ops `apply(model, {})` (every op auto),
`fully_shard` on every decoder layer and the root with
`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`, AdamW. Same model, data, seed and
timing as `veomni-ops train` (median step after one warm-up; the loss read on the host each step).

    torchrun --nproc-per-node N benchmarks/gpu/fsdp2_script.py [--batch-per-rank 4] [--plain] [--profile DIR]

--plain: without veomni-ops. Variants (off by default, for the issue's experiments): --fused (fused
AdamW), --split-root (the embedding and [norm, lm_head] sharded on their own), --keep-layers
(layers not resharded after forward), --bf16-reduce (gradients reduced in bf16).
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from veomni_ops import train as T

ap = argparse.ArgumentParser()
ap.add_argument("--arch", default="qwen3_moe")
ap.add_argument("--size", default="small")
ap.add_argument("--batch-per-rank", type=int, default=4)
ap.add_argument("--seq", type=int, default=2048)
ap.add_argument("--steps", type=int, default=14)
for flag in ("--plain", "--fused", "--split-root", "--keep-layers", "--bf16-reduce"):
    ap.add_argument(flag, action="store_true")
ap.add_argument("--profile", metavar="DIR")
ap.add_argument("--name", default="script")
a = ap.parse_args()

dist.init_process_group("nccl")
r, w = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", r)))
job = {"path": "script", "architecture": a.arch, "size": a.size, "overrides": {}, "train": dict(T.TRAIN_DEFAULTS, seed=0)}
model = T.build_model(job).cuda()  # float32 master weights
model.config._attn_implementation = "sdpa"
if not a.plain:
    import veomni_ops

    veomni_ops.apply(model, {})
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16 if a.bf16_reduce else torch.float32)
for layer in model.model.layers:
    fully_shard(layer, mp_policy=mp, reshard_after_forward=not a.keep_layers)
if a.split_root:
    fully_shard(model.model.embed_tokens, mp_policy=mp)
    fully_shard([model.model.norm, model.lm_head], mp_policy=mp)
fully_shard(model, mp_policy=mp)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=a.fused or None)

B = a.batch_per_rank * w
batches = [ids[r * a.batch_per_rank:(r + 1) * a.batch_per_rank]
           for ids in T.synthetic_batches(model.config.vocab_size, B, a.seq, a.steps + 3, 0, "cuda")]
rates, losses = [], []


def step(ids):
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss = out.loss.detach().float()
    dist.all_reduce(loss)
    losses.append(float(loss) / w)


for ids in batches[:a.steps]:
    t0 = time.perf_counter()
    step(ids)
    rates.append(B * a.seq / (time.perf_counter() - t0))
res = dict(name=a.name, world=w, veomni=not a.plain, variant=[k for k, v in vars(a).items() if v is True],
           tokens_per_s=statistics.median(rates[1:]), step_tokens_per_s=rates,
           peak_gib=torch.cuda.max_memory_allocated() / 2**30, losses=losses)
if a.profile:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from par_profile import profile_steps

    res["profile"] = profile_steps(step, batches[a.steps:], a.profile, a.name, r)
    with open(os.path.join(a.profile, f"{a.name}.r{r}.json"), "w") as fh:
        json.dump(res, fh, indent=1)
if r == 0:
    print(json.dumps({k: v for k, v in res.items() if k != "profile"}))
dist.destroy_process_group()
