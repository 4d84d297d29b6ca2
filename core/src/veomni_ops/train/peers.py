"""Peers in the job (issue 23): under torchrun, ``--compare OTHER`` and the FSDP2 baselines run
after the job's own run in the same ranks: the same processes, process group, seed and data.

The baselines (``transformers+fsdp2``, ``+compile``) are what a user writes by hand instead of a
``parallel:`` section (``benchmarks/gpu/fsdp2_script.py``): plain transformers (sdpa, nothing of
veomni-ops), float32 master weights, ``fully_shard`` on each decoder layer and on the root with
FSDP2's defaults (bf16 params / fp32 reduce for a bf16 or fp16 job; nothing cast for float32),
AdamW, every rank its rows of the global batch and its mean loss (FSDP2 averages the gradients).
That is the job's math over ``dp_shard`` ranks, so its losses are checked against the job's.

Each run's model is freed before the next one is built (``gc``, ``torch.cuda.empty_cache``, and
dynamo's caches after a compiled run, so each compiled run compiles and is timed on its own).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from typing import Any

from .baselines import BASELINES
from .loop import _train_parallel, check_layout, rank, train_on_rank
from .model import adamw, resolve_device


class UserFSDP2:
    """A user's own FSDP2 script, in the shape :func:`.loop._train` asks of a runtime."""

    def __init__(self, device: str, rank: int, world_size: int):
        self.device, self.rank, self.world_size = device, rank, world_size
        self.backend = "nccl" if device.startswith("cuda") else "gloo"
        self.fsdp_facts: dict[str, Any] = {}
        self.compile_facts: dict[str, Any] = {}

    def shard(self, model, dtype):
        """``fully_shard`` on each decoder layer, then on the root (the model in float32 first)."""
        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from ..parallel.fsdp import decoder_layers

        mesh = init_device_mesh("cuda" if self.device.startswith("cuda") else "cpu", (self.world_size,))
        low = dtype in (torch.bfloat16, torch.float16)
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if low else MixedPrecisionPolicy()
        layers = decoder_layers(model)
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        self.fsdp_facts = {"layers": len(layers), "mixed_precision": f"{str(dtype).removeprefix('torch.')} params, "
                           "float32 reduce" if low else "none (float32)", "reshard_after_forward": True,
                           "prefetch": "FSDP2's default (implicit)"}
        return model

    def compile(self, model, backend: str):
        from ..parallel.fsdp import compile_layers

        self.compile_facts = compile_layers(model, backend)
        return model

    def adamw(self, model, lr: float):
        return adamw(model.parameters(), lr, self.device)

    def shard_batch(self, input_ids, labels=None, position_ids=None) -> dict[str, Any]:
        """This rank's rows of the global batch (the runtime's ``shard_batch`` form, as the
        loop's ``step_inputs`` calls it): labels the inputs unless given; packed rows keep their
        ``position_ids``."""
        n = input_ids.shape[0] // self.world_size
        rows = slice(self.rank * n, (self.rank + 1) * n)
        out = {"input_ids": input_ids[rows], "labels": (input_ids if labels is None else labels)[rows]}
        if position_ids is not None:
            out["position_ids"] = position_ids.expand(input_ids.shape)[rows]
        return out

    def global_loss(self, loss) -> float:
        """The mean of every rank's mean loss: with the same tokens on every rank, the global mean."""
        import torch.distributed as dist

        t = loss.detach().float().reshape(1).clone()
        dist.all_reduce(t)
        return float(t) / self.world_size

    def to_dict(self) -> dict[str, Any]:
        return {"dp_shard": self.world_size, "sp": 1, "ep": 1, "world_size": self.world_size,
                "backend": self.backend, "fsdp": self.fsdp_facts,
                **({"compile": self.compile_facts} if self.compile_facts else {})}


def _train_fsdp2_baseline(job: dict[str, Any], baseline: str, out) -> dict[str, Any]:
    """This rank's part of ``baseline`` (one of the FSDP2 ones) of ``job``; only rank 0 prints.
    A rank that fails ends the others with its error, as in the job's own run."""
    from ..parallel.faults import FailureGuard
    from ..parallel.layout import world_from_env

    layout = check_layout(job)
    rt = UserFSDP2(_device(job), rank(), world_from_env())
    port = os.environ.get("MASTER_PORT")
    with FailureGuard(rt.rank, rt.world_size, os.environ.get("MASTER_ADDR"), int(port) if port else None,
                      timeout_s=layout.timeout_s):
        return train_on_rank(job, out, baseline, rt)


def _device(job: dict[str, Any]) -> str:
    """This rank's device, as the job's own runtime picks it."""
    from ..parallel.runtime import rank_device

    return rank_device(resolve_device(job["train"]["device"]))


@contextmanager
def _process_group(device: str, timeout_s: float) -> Iterator[None]:
    """One process group for every run of these ranks (each runtime makes its meshes on it and
    leaves it); destroyed after the last one (left as it is on an error: the ranks are ending)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", init_method="env://",
                            timeout=timedelta(seconds=timeout_s))
    yield
    dist.barrier()
    dist.destroy_process_group()


def _free(device: str, compiled: bool) -> None:
    """Let the last run's model, optimizer and compiled graphs go before the next is built."""
    import torch

    gc.collect()
    if compiled:
        import torch._dynamo

        torch._dynamo.reset()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def run_in_ranks(job: dict[str, Any], other: dict[str, Any] | None, baselines: list[str], out,
                 titles: tuple[str, str | None]) -> list[dict[str, Any]]:
    """Under torchrun: the job's run, then ``other``'s (``--compare``), then each FSDP2 baseline
    of ``job``, one after another in these ranks. Every rank returns every run's result (rank 0
    reports them). ``titles``: the job's and the other's, printed before each run by rank 0."""
    from ..parallel import ParallelConfigError
    from ..parallel.layout import world_from_env

    layouts = [check_layout(job)]  # both refused before anything trains
    if other is not None:
        try:
            layouts.append(check_layout(other))
        except ParallelConfigError as e:
            raise ParallelConfigError(f"--compare {titles[1]}: under torchrun both jobs run in the same "
                                      f"{world_from_env()} ranks, one after the other, so its layout must fit them "
                                      f"too: {e}") from None
    # (title, train(out) -> result, compiled)
    steps: list[tuple[str, Callable[[Any], dict[str, Any]], bool]] = [
        (titles[0], partial(_train_parallel, job), bool(job["train"]["compile"]))]
    if other is not None:
        steps.append((str(titles[1]), partial(_train_parallel, other), bool(other["train"]["compile"])))
    steps += [(f"baseline {name} ({BASELINES[name]})", partial(_train_fsdp2_baseline, job, name),
               name.endswith("+compile")) for name in baselines]
    device = _device(job)
    quiet = open(os.devnull, "w") if rank() != 0 else None
    runs = []
    try:
        with _process_group(device, max(lay.timeout_s for lay in layouts)):
            for i, (title, train, compiled) in enumerate(steps):
                if i:
                    _free(device, compiled or steps[i - 1][2])
                print(f"== {title}", file=quiet or out, flush=True)
                runs.append(train(out))
    finally:
        if quiet is not None:
            quiet.close()
    return runs


def train_baseline_in_ranks(job: dict[str, Any], baseline: str, out=None) -> dict[str, Any]:
    """This rank's run of the FSDP2 ``baseline`` of ``job`` alone (a ``--max-seq`` probe, under
    torch.distributed.run), in a process group of its own; only rank 0 prints."""
    import sys

    layout = check_layout(job)
    with _process_group(_device(job), layout.timeout_s):
        return _train_fsdp2_baseline(job, baseline, out or sys.stderr)
