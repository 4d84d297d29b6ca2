"""``ParallelRuntime``: one process's part of a parallel job.

    with ParallelRuntime.from_env(layout) as rt:        # torchrun's RANK / WORLD_SIZE / MASTER_*
        model = build(...)
        rt.prepare(model)                                # layout vs model; keep this rank's experts
        binding = veomni_ops.apply(model, ops, parallel=rt)   # plan resolved for the layout, kernels wrapped
        rt.parallelize(model, binding, dtype)            # FSDP2
        # optional: a model built on the meta device gets its shards here (reference: rank 0's normal build)
        rt.materialize(model, reference if rt.rank == 0 else None)
        rt.compile(model, backend="inductor")           # optional: each decoder layer (apply(..., compile=True))
        for ids in batches:                              # the global batch, the same on every rank
            out = model(**rt.shard_batch(ids))           # this rank's rows and sequence slice
            out.loss.backward()                          # every rank's loss is its share
            loss = rt.global_loss(out.loss)              # = the single-process loss

Process groups and meshes are PyTorch's (``init_process_group``, ``init_device_mesh``): gloo
on CPU, NCCL on CUDA. ``apply(..., parallel=rt)`` asks the plan for kernels whose spec declares
what the layout needs (``KernelSpec.parallel``: ``"sp"`` for attention when sp > 1, ``"ep"`` for
the experts when ep > 1), then :meth:`wrap_plan` wraps them: Ulysses around the attention kernel
(:mod:`.ulysses`), dispatch/combine around the experts kernel (:mod:`.expert`), and the
load-balancing loss over every rank's tokens. Binding then proceeds as in one process.

A runtime that finds no process group initialises one (``env://``) and destroys it at the end:
one job per process, as under torchrun. A process that runs several jobs initialises the group
itself; each runtime then makes its meshes on it and leaves it as it found it.
"""

from __future__ import annotations

import dataclasses
import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from ..ops import OP_DEFS
from .expert import shard_experts
from .faults import FailureGuard
from .fsdp import compile_layers, full_tensor, init_from_reference, shard_model
from .layout import ParallelConfigError, ParallelLayout, world_from_env
from .nodes import Nodes, check_nodes, node_note, process_group_store
from .ulysses import pad_to_multiple, seq_slice

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..binding import Binding
    from ..plan import KernelPlan

IGNORE_INDEX = -100


def rank_device(device: str = "auto") -> str:
    """This process's device for ``device`` (``auto``: cuda where there is one, else cpu): on
    CUDA one GPU per process, torchrun's ``LOCAL_RANK`` (``cuda:LOCAL_RANK``)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        return f"cuda:{int(os.environ.get('LOCAL_RANK', os.environ.get('RANK', '0')))}"
    return device


class ParallelRuntime:
    """Process groups, meshes and the per-rank helpers of one parallel job (module docstring)."""

    def __init__(self, layout: ParallelLayout, rank: int, local_rank: int, device: str):
        self.layout = layout
        self.rank, self.local_rank = rank, local_rank
        self.world_size = layout.world_size
        self.device = device
        self.backend = "nccl" if device.startswith("cuda") else "gloo"
        self.coords = layout.coords(rank)
        self.sp_group: dist.ProcessGroup | None = None
        self.ep_group: dist.ProcessGroup | None = None
        self.dense_mesh: DeviceMesh | None = None
        self.expert_mesh: DeviceMesh | None = None
        self.guard: FailureGuard | None = None
        self._owns_pg = False
        self._token_mask: torch.Tensor | None = None
        #: the input_ids shard_batch gave last, and the tokens each rank holds in a forward fed with them
        self._batch_ids: torch.Tensor | None = None
        self._even_tokens: int | None = None
        #: expert parallelism may use its even exchange (no host sync) for batches from shard_batch
        self.ep_even_dispatch = True
        self._expert_modules: list[nn.Module] = []
        self._expert_params: set[str] = set()
        self.fsdp_facts: dict[str, Any] = {}
        self.compile_facts: dict[str, Any] = {}
        self.init_facts: dict[str, Any] = {}
        self.nodes = Nodes(1, layout.world_size)

    # -- start and end ------------------------------------------------------------------------
    @classmethod
    def from_env(cls, layout: ParallelLayout | None = None, device: str = "auto") -> ParallelRuntime:
        """This process's runtime, from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
        MASTER_ADDR, MASTER_PORT). ``layout=None``: FSDP over every process."""
        world = world_from_env()
        layout = layout if layout is not None else ParallelLayout.data_parallel(world)
        layout.check_world(world)
        nodes = Nodes.from_env()
        check_nodes(layout, nodes)
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
        rt = cls(layout, rank, local_rank, rank_device(device))
        rt.nodes = nodes
        return rt

    def start(self) -> ParallelRuntime:
        timeout = timedelta(seconds=self.layout.timeout_s)
        if self.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(self.device))
        if not dist.is_initialized():
            dist.init_process_group(self.backend, rank=self.rank, world_size=self.world_size, timeout=timeout,
                                    **process_group_store(self.layout.timeout_s))
            self._owns_pg = True
        elif dist.get_world_size() != self.world_size:
            raise ParallelConfigError(f"the process group has {dist.get_world_size()} ranks, the layout "
                                      f"{self.world_size}")
        self.guard = FailureGuard(self.rank, self.world_size, os.environ.get("MASTER_ADDR"),
                                  int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else None,
                                  timeout_s=self.layout.timeout_s)
        self.guard.__enter__()
        self._make_meshes()
        return self

    def _make_meshes(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        kind = "cuda" if self.device.startswith("cuda") else "cpu"
        lay = self.layout
        # Inner dims are consecutive ranks (one node's, .nodes); dp_replicate outermost: HSDP's 2-D mesh.
        if lay.dp_replicate > 1:
            self.dense_mesh = init_device_mesh(kind, (lay.dp_replicate, lay.shard_size),
                                               mesh_dim_names=("dp_replicate", "fsdp"))
        else:
            self.dense_mesh = init_device_mesh(kind, (self.world_size,), mesh_dim_names=("fsdp",))
        if lay.sp > 1:
            grid = init_device_mesh(kind, (lay.dp_degree, lay.sp), mesh_dim_names=("dp", "sp"))
            self.sp_group = grid.get_group("sp")
        if lay.ep > 1:
            edp = lay.shard_size // lay.ep
            grid = init_device_mesh(kind, (lay.dp_replicate, edp, lay.ep), mesh_dim_names=("dp_replicate", "edp", "ep"))
            self.ep_group = grid.get_group("ep")
            self.expert_mesh = grid["dp_replicate", "edp"] if lay.dp_replicate > 1 else grid["edp"]

    def close(self, exc: BaseException | None = None) -> None:
        """End the job on this rank: on success a barrier, then the process group is destroyed;
        on failure the guard tells the other ranks (or raises :class:`ParallelFailure`)."""
        guard, self.guard = self.guard, None
        if exc is not None:
            if guard is not None:
                guard.__exit__(type(exc), exc, exc.__traceback__)
            return
        if guard is not None:
            guard.stop()
        if dist.is_initialized():
            dist.barrier()
            if self._owns_pg:
                dist.destroy_process_group()

    def __enter__(self) -> ParallelRuntime:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        self.close(exc)
        return False

    # -- the plan --------------------------------------------------------------------------------
    def needs(self) -> dict[str, tuple[str, ...]]:
        """Per op, what ``KernelSpec.parallel`` must declare for this layout (given to ``resolve``)."""
        return self.layout.needs()

    def wrap_plan(self, plan: KernelPlan) -> KernelPlan:
        """``plan`` with its kernels wrapped for this layout, each by its op folder's wrapper
        (``OpDef.wrapper``; attention: Ulysses; experts: EP; the load-balancing loss: over every
        rank's tokens). Refuses a kernel whose spec lacks what the layout needs."""
        from ..plan import KernelPlan

        needs = self.needs()
        entries = []
        for e in plan.entries:
            missing = [m for m in needs.get(e.op, ()) if m not in getattr(e.spec, "parallel", ())]
            if missing:
                raise ParallelConfigError(
                    f"{e.op} kernel {e.kernel!r} ({e.distribution}) does not declare parallel={missing} in its spec, "
                    f"which this layout needs (sp={self.layout.sp}, ep={self.layout.ep}); pick a kernel that does, "
                    "or resolve with the layout (veomni_ops.apply(model, config, parallel=runtime))")
            if e.fn is None:
                entries.append(e)
                continue
            d = OP_DEFS.get(e.op)
            wrapped = d.part("wrapper")(e.fn, self, e.kernel) if d is not None and d.wrapper else None
            if wrapped is None:
                entries.append(e)
                continue
            fn, note = wrapped
            entries.append(dataclasses.replace(e, fn=fn, reason=f"{e.reason}; {note}"))
        return KernelPlan(plan.device, plan.config, tuple(entries), mode=plan.mode)

    def even_tokens(self) -> int | None:
        """The tokens every rank of an expert group holds in this forward, when known (a batch from
        :meth:`shard_batch`; see :meth:`_note_batch`), else None: the expert-parallel wrapper reads it."""
        return self._even_tokens

    def token_mask(self) -> torch.Tensor | None:
        """The tokens that count on this rank in this batch (sequence-parallel padding left out), or
        None: the load-balancing wrapper reads it."""
        return self._token_mask

    # -- the model -------------------------------------------------------------------------------
    def prepare(self, model: nn.Module) -> None:
        """Before binding: check the layout against the model; keep only this rank's experts;
        under SP, refuse padding masks and calls without global position ids."""
        from ..binding import survey

        if getattr(model, "config", None) is not None:
            self.layout.check_model(model.config)
        places = survey(model)
        lay = self.layout
        if lay.sp > 1:
            attn = [p for p in places if p.op == "attention"]
            bad = [f"{p.path} ({p.foreign})" for p in attn if p.foreign]
            placed = {id(p.module) for p in attn}
            bad += [f"{n} ({type(m).__name__}: its forward does not call the attention interface)"
                    for n, m in model.named_modules()
                    if type(m).__name__.endswith("Attention") and id(m) not in placed and hasattr(m, "head_dim")]
            if bad or not attn:
                raise ParallelConfigError(f"parallel.sp {lay.sp}: sequence parallelism wraps the bound attention "
                                          "kernel, and these attention modules cannot take it: "
                                          + (", ".join(bad) or "the model has no attention place"))
            model.register_forward_pre_hook(_sp_input_check(lay.sp), with_kwargs=True)
        if lay.ep > 1:
            experts = [p for p in places if p.op == "moe_experts"]
            if not experts:
                raise ParallelConfigError(f"parallel.ep {lay.ep}: the model has no routed experts veomni-ops can bind; "
                                          "use ep: 1")
            bad = [f"{p.path} ({p.foreign})" for p in experts if p.foreign]
            if bad:
                raise ParallelConfigError(f"parallel.ep {lay.ep}: expert modules overridden by user code cannot be "
                                          f"expert-parallel: {', '.join(bad)}")
            model.register_forward_pre_hook(self._note_batch, with_kwargs=True)
            names = {id(m): n for n, m in model.named_modules()}
            for p in experts:
                shard_experts(p.module, lay.ep, self.coords["ep"])
                self._expert_modules.append(p.module)
                prefix = names[id(p.module)]
                self._expert_params |= {f"{prefix}.gate_up_proj", f"{prefix}.down_proj"}

    def parallelize(self, model: nn.Module, binding: Binding, dtype: torch.dtype) -> nn.Module:
        """After binding: check every place the layout wraps got its kernel; then FSDP2."""
        bound = {(path, op) for path, op, _, _ in binding.bound}
        names = {id(m): n for n, m in model.named_modules()}
        missing = [names[id(m)] for m in self._expert_modules if (names[id(m)], "moe_experts") not in bound]
        if missing:
            why = sorted({w for p, op, w in binding.skipped if op == "moe_experts" and p in missing})
            raise ParallelConfigError(f"parallel.ep {self.layout.ep}: the experts at {', '.join(missing)} were not "
                                      "bound, so they would not be expert-parallel"
                                      + (f" ({'; '.join(why)}); give the experts a kernel that runs here (change what "
                                         "refuses them: moe_implementation, the dtype, compile mode)" if why else ""))
        if self.dense_mesh is None:
            raise RuntimeError("ParallelRuntime.parallelize needs the started runtime (start() or `with runtime:`)")
        self.fsdp_facts = shard_model(model, self.dense_mesh, dtype, self._expert_modules, self.expert_mesh,
                                      reduce_dtype=getattr(torch, self.layout.reduce_dtype))
        return model

    def materialize(self, model: nn.Module, reference: nn.Module | None) -> nn.Module:
        """After :meth:`parallelize` of a model built on the meta device: allocate this rank's
        shards on its device and fill them with the weights (and buffers) of ``reference``, the
        model built normally, which only rank 0 needs (others pass None): see
        :func:`.fsdp.init_from_reference`. A collective: call it on every rank."""
        self.init_facts = {"init_device": "meta", **init_from_reference(model, reference, self.device)}
        return model

    def compile(self, model: nn.Module, backend: str = "inductor") -> nn.Module:
        """After :meth:`parallelize`: ``torch.compile`` every decoder layer in place
        (:func:`.fsdp.compile_layers`); the plan must have been resolved with ``compile=True``."""
        binding = model.__dict__.get("veomni_ops_binding")
        if binding is not None and not binding.plan.compile:
            raise ParallelConfigError("ParallelRuntime.compile: the model's plan was resolved for eager mode; bind it "
                                      "with veomni_ops.apply(model, config, compile=True, parallel=runtime)")
        if not self.fsdp_facts:
            raise RuntimeError("ParallelRuntime.compile comes after parallelize (FSDP2 first, then the layers compiled)")
        self.compile_facts = compile_layers(model, backend)
        return model

    def _note_batch(self, module, args, kwargs):
        """Forward pre-hook (ep > 1): is this forward fed with ``shard_batch``'s input_ids? Then
        every rank of an expert group holds the same number of tokens (rows B / dp_shard, the
        padded sequence / sp), which lets the experts exchange without counting (:mod:`.expert`)."""
        ids = kwargs.get("input_ids", args[0] if args else None)
        same = self.ep_even_dispatch and ids is not None and ids is self._batch_ids
        self._even_tokens = int(ids.numel()) if same else None
        return None

    # -- the data --------------------------------------------------------------------------------
    def shard_batch(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                    position_ids: torch.Tensor | None = None) -> dict[str, Any]:
        """This rank's model inputs from the *global* batch ``[B, S]`` (the same on every rank):
        rows ``B / dp_shard`` of its data-parallel index, the ``1/sp`` slice of the sequence
        (padded at the end to a multiple of sp: padding predicts nothing and, being last, no real
        token attends to it), the global ``position_ids`` of that slice, the labels shifted on the
        global sequence (``shift_labels``), and ``num_items_in_batch``, the number of counted
        tokens over all ranks, so that every rank's loss is its share of the global mean.
        ``position_ids`` (``[B or 1, S]``, default ``0..S-1``): restarting positions mark packed
        documents; attention then stays within each document across the sequence slices."""
        from ..losses import shifted_labels

        lay = self.layout
        b, s = input_ids.shape
        lay.check_batch(b)
        labels = input_ids if labels is None else labels
        n = b // lay.dp_degree  # rows of each data-parallel index (dp_replicate x dp_shard of them)
        rows = slice(self.coords["dp"] * n, (self.coords["dp"] + 1) * n)
        ids, shift = input_ids[rows], shifted_labels(labels[rows], IGNORE_INDEX)
        if position_ids is None:
            pos = torch.arange(s, device=ids.device).expand(ids.shape[0], s)
        else:
            pos = position_ids.to(ids.device).expand(b, s)[rows]
        self._token_mask = None
        if lay.sp > 1:
            padded = (-s) % lay.sp
            ids = pad_to_multiple(ids, lay.sp, 0)
            shift = pad_to_multiple(shift, lay.sp, IGNORE_INDEX)
            # padding continues the last document's positions (no restart: no new document)
            pos = torch.cat([pos, pos[:, -1:] + torch.arange(1, padded + 1, device=pos.device)], dim=-1)
            if padded:
                real = torch.arange(s + padded, device=ids.device) < s
                self._token_mask = seq_slice(real.expand(ids.shape[0], -1), lay.sp, self.coords["sp"]).contiguous()
            ids, shift, pos = (seq_slice(x, lay.sp, self.coords["sp"]).contiguous() for x in (ids, shift, pos))
        self._batch_ids = ids
        count = (shift != IGNORE_INDEX).sum().to(torch.float32)
        dist.all_reduce(count)
        # use_cache=False: no KV cache in training (transformers builds one by default, and then ignores
        # packed position_ids when it builds the mask)
        return {"input_ids": ids, "position_ids": pos, "shift_labels": shift, "num_items_in_batch": count,
                "use_cache": False}

    def global_loss(self, loss: torch.Tensor) -> float:
        """The sum of every rank's loss share: the loss one process would report."""
        t = loss.detach().float().reshape(1).clone()
        dist.all_reduce(t)
        return float(t)

    # -- inspection ------------------------------------------------------------------------------
    @property
    def expert_params(self) -> frozenset[str]:
        """The names of the parameters of which this rank holds its ``E / ep`` experts (``ep > 1``)."""
        return frozenset(self._expert_params)

    def gather_full(self, model: nn.Module, grads: bool = False) -> dict[str, torch.Tensor]:
        """Every parameter (or its gradient) whole, on every rank: FSDP shards gathered, expert
        slices gathered over the expert group. A collective: call it on every rank."""
        out = {}
        for name, p in model.named_parameters():
            t = p.grad if grads else p.detach()
            if t is None:
                continue
            t = full_tensor(t)
            if name in self._expert_params:
                got = [torch.empty_like(t) for _ in range(self.layout.ep)]
                dist.all_gather(got, t.contiguous(), group=self.ep_group)
                t = torch.cat(got)
            out[name] = t
        return out

    def describe(self) -> str:
        c = self.coords
        note = node_note(self.layout, self.nodes)
        return (self.layout.describe() + (f"\n  {note}" if note else "") + f"\n  this is rank {self.rank} (dp {c['dp']}, sp {c['sp']}, ep {c['ep']}) on "
                f"{self.device}, backend {self.backend}")

    def to_dict(self) -> dict[str, Any]:
        return {**self.layout.to_dict(), "backend": self.backend, **({"fsdp": self.fsdp_facts} if self.fsdp_facts else {}),
                **({"compile": self.compile_facts} if self.compile_facts else {}),
                **({"init": self.init_facts} if self.init_facts else {})}

    def adamw(self, model: nn.Module, lr: float) -> torch.optim.AdamW:
        """The job's AdamW over ``model``'s (sharded) parameters. On CUDA the fused implementation:
        one kernel and one DTensor dispatch per parameter group, where the default runs a dozen
        ``_foreach`` ops, each dispatched through DTensor (host time issue 23's profile showed);
        the same update rule. One parameter group per device mesh (the dense parameters', the
        experts'), so that no fused call mixes meshes."""
        groups: dict[int, list[nn.Parameter]] = {}
        for p in model.parameters():
            groups.setdefault(id(getattr(p, "device_mesh", None)), []).append(p)
        fused = True if self.device.startswith("cuda") else None
        return torch.optim.AdamW([{"params": g} for g in groups.values()], lr=lr, fused=fused)


def _sp_input_check(sp: int):
    def hook(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor):
            if mask.dim() == 2 and bool(mask.all()):
                kwargs["attention_mask"] = None
            else:
                raise ValueError(f"sequence parallelism (sp={sp}) takes no padding mask: every rank holds a slice of "
                                 "the sequence and attention is causal over the gathered sequence. Pack documents "
                                 "into rows with restarting position_ids instead (ParallelRuntime.shard_batch)")
        if kwargs.get("position_ids") is None and (len(args) < 3 or args[2] is None):
            raise ValueError(f"sequence parallelism (sp={sp}) needs the position_ids of the global sequence for each "
                             "rank's slice (ParallelRuntime.shard_batch gives them)")
        return args, kwargs

    return hook
