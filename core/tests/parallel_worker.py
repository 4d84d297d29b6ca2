"""One rank of a parallel test job (started by test_parallel.py as torchrun would: RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment).

    python parallel_worker.py SCENARIOS.json OUT_DIR

Runs every scenario of the file in turn (each a layout, a tiny model, a few optimizer steps)
with the library's API, as ``veomni-ops train`` does, and rank 0 saves the per-step global
losses, the gathered gradients of every step and the gathered parameters after the last step
to ``OUT_DIR/<name>.pt``. The optimizer is plain SGD by default: AdamW's first steps are
``lr * sign(grad)`` and turn float32 noise in a near-zero gradient into a full-size update, which
would hide what the comparison is for (``"opt": "adamw"`` for the real one). The single-process reference (:func:`run_reference`) is in this
module too, so both sides build the same model from the same seed and data.

``"ep_counted": true`` makes expert parallelism take its counted exchange (tokens only to the
ranks owning their experts; a host sync a layer) instead of the even one the runtime's batches
allow. A scenario may ask a rank to fail (``"fail": {"rank": 1, "step": 1}``) to test fault handling,
or to die without a word (``"kill": true`` beside them: SIGKILL, as the OOM killer or a scheduler does).
``"checkpoint": true``: the decoder layers are checkpointed (``train.gradient_checkpointing``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import types
from typing import Any

import torch
from veomni_ops import apply
from veomni_ops.train import build_model, synthetic_batches
from veomni_ops.train.data import job_batches
from veomni_ops.train.loop import step_inputs
from veomni_ops.train.model import checkpoint_layers

#: small enough for a 2-core CI machine, large enough for 2 heads per rank at sp=2
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2)


def build(sc: dict[str, Any], device: str = "cpu"):
    job = {"architecture": sc["arch"], "size": "tiny", "config_file": None,
           "overrides": {**TINY, **sc.get("config", {})}, "train": {"seed": sc.get("seed", 0)}}
    model = build_model(job, device).to(getattr(torch, sc.get("dtype", "float32")))
    if sc.get("route_to_first_half"):
        for m in model.modules():
            if type(m).__name__.endswith("TopKRouter"):
                m.forward = types.MethodType(_first_half_router, m)
    return model


def _first_half_router(self, hidden_states):
    """The Qwen3-MoE router, but only experts [0, E/2) can win: the second half gets no token
    (and, under ep=2, its rank receives none)."""
    h = hidden_states.reshape(-1, self.hidden_dim)
    logits = torch.nn.functional.linear(h, self.weight)
    block = torch.zeros(self.num_experts, dtype=logits.dtype, device=logits.device)
    block[self.num_experts // 2:] = -1e4
    logits = logits + block
    probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    top, idx = torch.topk(probs, self.top_k, dim=-1)
    if self.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top.to(logits.dtype), idx


def batches(model, sc) -> list[dict[str, Any]]:
    """The global batches of the scenario's steps (``input_ids``, ``labels``, ``position_ids``):
    ``"data": {...}``, the job's packed documents (a ``data:`` section,
    :func:`veomni_ops.train.data.job_batches`); else the synthetic rows, positioned by ``"packed"``."""
    vocab, seed = model.config.vocab_size, sc.get("seed", 0)
    if sc.get("data"):
        job = {"train": {"batch_size": sc["batch"], "seq_len": sc["seq"], "steps": sc["steps"], "seed": seed},
               "data": sc["data"]}
        return [{k: b[k] for k in ("input_ids", "labels", "position_ids")} for b in job_batches(job, vocab, "cpu")]
    return [{"input_ids": ids, "labels": ids, "position_ids": positions(sc)}
            for ids in synthetic_batches(vocab, sc["batch"], sc["seq"], sc["steps"], seed, "cpu")]


def positions(sc) -> torch.Tensor | None:
    """``"packed": [starts...]``: position ids ``[B, S]`` restarting at those offsets (documents)."""
    if not sc.get("packed"):
        return None
    pos = torch.arange(sc["seq"])
    for start in sc["packed"]:
        pos[start:] -= pos[start].clone()
    return pos.expand(sc["batch"], -1).clone()


def optimizer(model, sc):
    if sc.get("opt", "sgd") == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=sc.get("lr", 1e-3))
    return torch.optim.SGD(model.parameters(), lr=sc.get("lr", 0.1))


def run_reference(sc: dict[str, Any]) -> dict[str, Any]:
    """The same job in this one process."""
    model = build(sc)
    binding = apply(model, sc["ops"])
    if sc.get("checkpoint"):
        checkpoint_layers(model)
    opt = optimizer(model, sc)
    losses, grads = [], []
    for batch in batches(model, sc):
        out = model(**step_inputs(batch))  # the job's one-process call
        out.loss.backward()
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params, "plan": binding.plan.to_dict()}


def run_parallel(sc: dict[str, Any], out_dir: str) -> None:
    from torch._dynamo.utils import counters
    from veomni_ops.parallel import ParallelLayout, ParallelRuntime

    layout = ParallelLayout.from_dict(sc["parallel"])
    dtype = getattr(torch, sc.get("dtype", "float32"))
    with ParallelRuntime.from_env(layout, "cpu") as rt:
        meta = sc.get("init") == "meta"
        counters.clear()  # graph breaks are counted per scenario
        model = build(sc, "meta" if meta else "cpu")  # meta: no memory; rank 0 alone builds the normal model too
        rt.prepare(model)
        binding = apply(model, sc["ops"], parallel=rt, compile=bool(sc.get("compile")))
        if rt.rank == 0:
            print(f"== {sc['name']}\n{binding.plan.table()}\n{rt.describe()}", flush=True)
        rt.parallelize(model, binding, dtype)
        if meta:
            rt.materialize(model, build(sc) if rt.rank == 0 else None)
        if sc.get("checkpoint"):  # as veomni-ops train does: after FSDP2, before the layers compile
            checkpoint_layers(model)
        if sc.get("compile"):
            rt.compile(model, backend=sc["compile"])
        initial = rt.gather_full(model)
        buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        rt.ep_even_dispatch = not sc.get("ep_counted")  # the counted exchange (a host sync a layer) when asked
        opt = optimizer(model, sc)
        losses, grads = [], []
        fail = sc.get("fail") or {}
        for i, batch in enumerate(batches(model, sc)):
            if fail.get("rank") == rt.rank and fail.get("step") == i:
                if fail.get("kill"):
                    os.kill(os.getpid(), signal.SIGKILL)
                raise ValueError(f"injected fault on rank {rt.rank} at step {i}")
            out = model(**step_inputs(batch, rt))  # the job's call: this rank's part of the global batch
            out.loss.backward()
            grads.append(rt.gather_full(model, grads=True))
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(rt.global_loss(out.loss))
        params = rt.gather_full(model)
        received = torch.zeros(2, rt.world_size, dtype=torch.long)  # rows received, calls by the even exchange
        entry = binding.plan.get("moe_experts", "standard")
        if entry is not None and hasattr(entry.fn, "veomni_ops_ep"):
            stats = entry.fn.veomni_ops_ep["stats"]
            received[:, rt.rank] = torch.tensor([stats["received_rows"], stats["even_calls"]])
        torch.distributed.all_reduce(received)
        if rt.rank == 0:
            from veomni_ops.parallel.fsdp import graph_breaks

            torch.save({"losses": losses, "grads": grads, "params": params, "received_rows": received[0].tolist(),
                        "even_calls": received[1].tolist(), "plan": binding.plan.to_dict(), "initial": initial,
                        "buffers": buffers, "compile": rt.compile_facts, "graph_breaks": graph_breaks(),
                        "graphs": counters["stats"]["unique_graphs"], "meshes": meshes(model),
                        "reduce_dtypes": reduce_dtypes(model)},
                       os.path.join(out_dir, f"{sc['name']}.pt"))


def meshes(model) -> dict[str, Any]:
    """Per parameter, the mesh FSDP2 shards it over: its shape, dim names and placements."""
    out = {}
    for name, p in model.named_parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None:
            out[name] = {"shape": tuple(mesh.shape), "dims": mesh.mesh_dim_names,
                         "placements": [str(x) for x in p.placements]}
    return out


def reduce_dtypes(model) -> dict[str, str]:
    """Per module FSDP2 wraps (experts, layers, root ``""``), its MixedPrecisionPolicy's reduce dtype."""
    from torch.distributed.fsdp import FSDPModule

    return {name: str(m._get_fsdp_state()._mp_policy.reduce_dtype)
            for name, m in model.named_modules() if isinstance(m, FSDPModule)}


def main(argv: list[str]) -> int:
    from datetime import timedelta

    with open(argv[0]) as fh:
        scenarios = json.load(fh)
    # One process group for all scenarios (each runtime makes its own meshes on it).
    timeout = min(float(sc["parallel"].get("timeout_s", 600)) for sc in scenarios)
    torch.distributed.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    for sc in scenarios:
        run_parallel(sc, argv[1])
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])  # an error raises here: a traceback and a non-zero exit, as always
    # Done and the group destroyed: skip the interpreter's finalisation, where torch's gloo
    # teardown can abort a rank that finished cleanly (see tests/clients/fsdp2_worker.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
