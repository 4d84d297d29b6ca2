"""FSDP2 (``torch.distributed.fsdp.fully_shard``) over the job's data-parallel ranks.

``fully_shard`` goes on every expert module first (over the ranks that own the same experts,
when ``ep > 1``), then on every decoder layer (the model's ``_no_split_modules`` classes), then
on the root, all over the ``dp_shard x sp`` ranks. Gradients are *summed* (divide factor 1):
every rank's loss is already its share of the global loss (normalised by the global token
count), so the sum is the single-process gradient.

Mixed precision follows the job's dtype: for bfloat16/float16 the sharded parameters are kept
in float32 (the optimizer's master copy), gathered and computed in the job's dtype, and
gradients are reduced in float32 -- or in bfloat16 where the job says ``parallel.reduce_dtype:
bfloat16`` (a bfloat16 job only; it halves the bytes of the reduce-scatter, and of HSDP's
all-reduce across replicas, which FSDP2 runs in the same reduce dtype). For float32 nothing is cast.

Overlap (issue 23's profile: a small model's step is bound by the host, and every all-gather
the GPU waits for is a wait for the slower rank):

* **reshard after forward** only when the model is big: a layer's gathered parameters stay
  from its forward to its backward (``reshard_after_forward=False``: no second all-gather in
  backward, half the all-gathers of a step) when all the parameters in the compute dtype take
  at most 1/8 of the device's memory (:func:`keep_gathered`); otherwise FSDP2's default.
* **explicit forward prefetch**: each layer's pre-forward issues the next layer's all-gather
  (and its experts'), so it runs under this layer's compute instead of after it; backward
  prefetches the previous layer the same way.

After sharding: :func:`init_from_reference` materialises a model built on the meta device with
the weights of a normal build (rank 0's, broadcast a tensor at a time), and
:func:`compile_layers` compiles each decoder layer's forward in place (FSDP2's hooks stay eager;
it also compiles a model of one process, without FSDP2: ``veomni_ops.compile_layers``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def _fsdp():
    try:
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    except ImportError as e:  # torch < 2.6
        raise RuntimeError(f"parallel training needs FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6); "
                           f"this torch is {torch.__version__}: upgrade torch ({e})") from None
    return fully_shard, MixedPrecisionPolicy, FSDPModule


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The modules to shard one by one: instances of the model's ``_no_split_modules`` classes
    (transformers' own hint for FSDP), else every ``*DecoderLayer``."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    found = [m for m in model.modules() if m is not model and type(m).__name__ in names]
    if not found:
        found = [m for m in model.modules() if m is not model and type(m).__name__.endswith("DecoderLayer")]
    return found


def device_memory_bytes(device: torch.device | str) -> int:
    """Total memory of ``device`` (a CUDA GPU's, else the host's physical memory; 0 if unknown)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return 0


#: the share of device memory the gathered (compute-dtype) parameters may hold from forward to backward
KEEP_GATHERED_SHARE = 1 / 8


def keep_gathered(model: nn.Module, compute_dtype: torch.dtype, device: torch.device | str) -> tuple[bool, str]:
    """Whether to keep every layer's gathered parameters from its forward to its backward
    (``reshard_after_forward=False``), and why: when the whole model in ``compute_dtype`` takes at
    most :data:`KEEP_GATHERED_SHARE` of the device's memory."""
    size = sum(p.numel() for p in model.parameters()) * torch.empty((), dtype=compute_dtype).element_size()
    total = device_memory_bytes(device)
    keep = 0 < size <= KEEP_GATHERED_SHARE * total
    why = (f"parameters in {str(compute_dtype).removeprefix('torch.')} {size / 2**30:.2f} GiB "
           f"{'<=' if keep else '>'} 1/{round(1 / KEEP_GATHERED_SHARE)} of {total / 2**30:.0f} GiB device memory")
    return keep, why


def shard_model(model: nn.Module, dense_mesh: DeviceMesh, compute_dtype: torch.dtype,
                expert_modules: Iterable[nn.Module] = (), expert_mesh: DeviceMesh | None = None,
                reshard_after_forward: bool | None = None,
                reduce_dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Apply FSDP2 to ``model`` in place (see the module docstring). ``reshard_after_forward``:
    None decides by :func:`keep_gathered`. ``reduce_dtype``: what gradients are summed in across
    ranks, float32 or (with a bfloat16 ``compute_dtype`` only) bfloat16; every ``fully_shard``
    (experts, layers, root) gets it. Returns what was decided (for the job's report)."""
    if reduce_dtype not in (torch.float32, torch.bfloat16) or (reduce_dtype != torch.float32
                                                               and compute_dtype != torch.bfloat16):
        raise ValueError(f"reduce_dtype {reduce_dtype} needs compute dtype torch.bfloat16 (got {compute_dtype}): "
                         "bfloat16 gradient reduction is for a bfloat16 job; reduce in torch.float32")
    fully_shard, MixedPrecisionPolicy, FSDPModule = _fsdp()
    facts: dict[str, Any] = {}
    if reshard_after_forward is None:
        keep, facts["reshard_why"] = keep_gathered(model, compute_dtype, dense_mesh.device_type)
        reshard_after_forward = not keep
    facts["reshard_after_forward"] = reshard_after_forward
    if compute_dtype in (torch.bfloat16, torch.float16):
        model.to(torch.float32)  # the sharded master copy
        mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype)
    else:
        mp = MixedPrecisionPolicy()
    experts = list(expert_modules)
    for m in experts:
        fully_shard(m, mesh=expert_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer, mesh=dense_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dense_mesh, mp_policy=mp)
    _prefetch(model, layers, experts)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    facts["prefetch"] = "explicit: next layer in forward, previous in backward"
    return facts


def _prefetch(model: nn.Module, layers: list[nn.Module], experts: list[nn.Module]) -> None:
    """Each layer's pre-forward starts the next layer's all-gathers (the layer's and its experts'),
    and its pre-backward the previous layer's; the root's pre-forward starts the first layer's."""
    units = []  # per layer: the layer, then the expert modules inside it (sharded on their own)
    for layer in layers:
        inside = {id(m) for m in layer.modules()}
        units.append([layer, *[e for e in experts if id(e) in inside]])
    if not units:
        return
    cast(Any, model).set_modules_to_forward_prefetch(units[0])
    for i, unit in enumerate(units):
        head = cast(Any, unit[0])
        if i + 1 < len(units):
            head.set_modules_to_forward_prefetch(units[i + 1])
        if i > 0:
            head.set_modules_to_backward_prefetch(units[i - 1])


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind an FSDP-sharded one (a collective over its mesh); others as they are."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def compile_layers(model: nn.Module, backend: str = "inductor", fullgraph: bool = False,
                   mode: str = "default") -> dict[str, Any]:
    """``torch.compile`` every decoder layer's ``forward`` in place (after FSDP2 sharded it, under
    a layout; or a model of one process). ``veomni_ops.compile_layers`` is this function.

    Why not the whole model: the attention mask. The model's forward builds it before the
    layers; run eagerly, transformers leaves it out (``None``) for a batch without padding or
    packing, and sdpa runs its flash kernel with ``is_causal``. Traced by dynamo, transformers
    5.17 builds it whole (``[B, 1, S, S]``: it cannot read the batch while tracing) and sdpa
    leaves its flash path: 2.4x slower than eager at 32k tokens on Qwen3-30B-A3B's shapes (issue
    35). Here the mask is
    built eagerly, and each compiled layer call runs inside the attention kernels'
    :func:`~veomni_ops.ops.attention.packing.positions_checked` for its ``position_ids``, so that
    the kernel, which cannot check them while traced, knows that they do not restart (no packed
    documents) and leaves its own block mask out too.

    The layer's module call stays eager: FSDP2's pre/post-forward hooks (the all-gathers and
    reshards, which FSDP2 marks as not traceable) run around the compiled forward, as with
    torchtitan's per-block compile, so they are no graph break. Compiling the forward in place
    (not wrapping the layer in an ``OptimizedModule``) keeps every parameter's name, the FSDP2
    prefetch order and the binding's modules as they are. All layers of one class share one
    graph (parameters are graph inputs), so a deep model compiles once. The embedding, the
    final norm and the head stay eager. ``fullgraph=False``: a place dynamo cannot trace
    (transformers' router-logit capture in MoE layers) runs eagerly between graphs instead of
    failing; transformers' capture of router logits and attentions is no such place
    (:func:`_captured_outputs_as_global`). ``mode``: torch.compile's (``default``: none passed;
    ``reduce-overhead`` records each layer's forward and backward as CUDA graphs, on CUDA, where
    its shapes are static). Returns what was compiled (for the job's report)."""
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no decoder layers to compile (none of its modules is one of "
                         "its _no_split_modules or a *DecoderLayer)")
    collector = _output_collector()
    for layer in layers:
        compiled = torch.compile(layer.forward, backend=backend, fullgraph=fullgraph, mode=None if mode == "default" else mode)
        cast(Any, layer).forward = _positions_checked(_captured_outputs_as_global(compiled, collector))
    kinds = sorted({type(m).__name__.removeprefix("FSDP") for m in layers})
    sharded = any(type(m).__name__.startswith("FSDP") for m in layers)
    return {"what": "decoder layers", "layers": len(layers), "classes": kinds, "backend": backend,
            "fullgraph": fullgraph, "mode": mode, "eager": "embedding, attention mask, final norm, head and loss"
            + ("; FSDP2's hooks" if sharded else "")}


def _positions_checked(forward: Any) -> Any:
    """``forward`` (a compiled layer's) called inside
    :func:`~veomni_ops.ops.attention.packing.positions_checked` for the ``position_ids`` it is
    given (transformers passes them by keyword), unless the call is itself being traced.

    A KV cache given to the layer while autograd records (training with transformers' default
    ``use_cache=True``) is warned about, once: the layer's attention writes it at the layer's
    own index, which dynamo guards on, so every layer compiles a graph of its own, and past
    ``torch._dynamo.config.cache_size_limit`` (8) layers the rest run eagerly."""
    from ..ops import attention
    from ..ops.base import load

    positions_checked = load(".packing:positions_checked", attention.OP.package)  # its folder's own module

    warned: list[bool] = []

    def checked(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return forward(*args, **kwargs)
        if not warned and torch.is_grad_enabled() and any(kwargs.get(k) is not None for k in _CACHE_KWARGS):
            warned.append(True)
            warnings.warn("compiled decoder layers were given a KV cache while training (transformers builds one "
                          "when use_cache is True, its default): each layer then compiles a graph of its own, and "
                          "past torch._dynamo.config.cache_size_limit layers run eagerly. Train with "
                          "model(..., use_cache=False) (or model.config.use_cache = False)", stacklevel=2)
        with positions_checked(kwargs.get("position_ids")):
            return forward(*args, **kwargs)

    return checked


#: The decoder layers' KV-cache keyword (transformers 5.17-5.23: past_key_values; 5.24: cache).
_CACHE_KWARGS = ("past_key_values", "cache")


def _output_collector() -> Any:
    """transformers' output-capture variable (``output_capturing._active_collector``: the dict of
    lists its forward hooks append router logits, attentions and hidden states to while a
    ``capture_outputs`` forward runs), or None where this transformers has none of that form."""
    try:
        from transformers.utils import output_capturing
    except ImportError:
        return None
    c = getattr(output_capturing, "_active_collector", None)
    return c if all(hasattr(c, a) for a in ("compiling", "global_var", "context_var")) else None


def _captured_outputs_as_global(compiled: Any, collector: Any) -> Any:
    """``compiled`` (a layer's compiled forward), run so that transformers' output-capturing
    hooks inside the layer trace instead of breaking the graph.

    Those hooks (on the MoE router, the attention) read a ``ContextVar``, which dynamo cannot
    trace: under a per-layer compile each MoE layer broke into two graphs with eager code
    between (``Unsupported method call ... ContextVar``). transformers' own
    ``CompileableContextVar`` reads a plain attribute instead while its ``compiling`` flag is set
    (set when the whole model is compiled). Around each compiled layer call this sets that flag
    and hands the hooks a per-call dict: the outer collection's keys, with a fresh empty list
    for each list it collects (so every call traces the same: dynamo guards on the lists'
    lengths, and one list growing by a layer per call would recompile for every layer), whose
    entries are appended to the outer lists afterwards, in order. Hidden states keep the outer
    list: their hook sits on the layer module, outside the compiled ``forward``, and numbers the
    states by the list's length. The flag is cleared after the call, also on error; a call that
    is itself being traced (a compiled caller) passes straight through. Not thread-safe while a
    layer runs (transformers' flag is a plain attribute; so is its whole-model compile)."""
    if collector is None:
        return compiled

    def forward(*args: Any, **kwargs: Any) -> Any:
        if collector.compiling or torch.compiler.is_compiling():
            return compiled(*args, **kwargs)
        outer = collector.context_var.get()
        inner = None if outer is None else {
            k: [] if isinstance(v, list) and k != "hidden_states" else v for k, v in outer.items()}
        collector.global_var, collector.compiling = inner, True
        try:
            out = compiled(*args, **kwargs)
        finally:
            collector.global_var, collector.compiling = None, False
        if inner is not None:
            for k, v in inner.items():
                if v is not outer[k]:
                    outer[k].extend(v)
        return out

    return forward


def graph_breaks() -> dict[str, int]:
    """Dynamo's graph breaks so far in this process, by reason's first line (empty: none)."""
    from torch._dynamo.utils import counters

    out: dict[str, int] = {}
    for reason, n in counters["graph_break"].items():
        lines = [x.strip() for x in str(reason).splitlines() if x.strip()]
        key = " ".join(lines[:2]) if lines else "?"
        out[key] = out.get(key, 0) + int(n)
    return out


def init_from_reference(model: nn.Module, reference: nn.Module | None, device: torch.device | str,
                        group: Any = None) -> dict[str, int]:
    """Materialise ``model`` (built on the meta device, bound, maybe FSDP2-sharded and with this
    rank's experts only) on ``device`` and give it the weights of ``reference``: the same model
    built normally (it is only read on rank 0 of ``group``; other ranks pass None).

    ``model.to_empty`` allocates every parameter and buffer uninitialised; then, one tensor at a
    time in the reference's order, rank 0 broadcasts the whole tensor over ``group`` (the world
    when None; no communication without a process group) and every rank copies its part into
    its own: the FSDP2 shard of a sharded parameter (the ``Shard(0)`` chunk, as FSDP2 cuts it),
    this rank's experts of an expert-parallel one (the block ``shard_experts`` kept), the whole of
    anything else. Buffers travel too: non-persistent ones such as rotary ``inv_freq`` are in no
    state dict, and ``to_empty`` leaves them garbage. Every parameter and buffer must come from
    the reference (same names): one it lacks is an error on every rank. Peak extra memory on
    ``device`` is one whole tensor. Returns counts (tensors, elements) for the report."""
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank(group) if distributed else 0
    if rank == 0 and reference is None:
        raise ValueError("init_from_reference: rank 0 needs the reference model")
    model.to_empty(device=device)
    experts = _expert_blocks(model)
    targets: dict[str, torch.Tensor] = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    manifest: list[Any] = [None]
    ref: dict[str, torch.Tensor] = {}
    if reference is not None and rank == 0:
        ref = {**dict(reference.named_parameters()), **dict(reference.named_buffers())}
        manifest = [[(n, tuple(t.shape), t.dtype) for n, t in ref.items()]]
    src = dist.get_global_rank(group, 0) if distributed and group is not None else 0
    if distributed:
        dist.broadcast_object_list(manifest, src=src, group=group)
    names = [n for n, _, _ in manifest[0]]
    missing = sorted(set(targets) - set(names))
    if missing:
        raise ValueError(f"init_from_reference: the reference model has no {', '.join(missing[:5])}"
                         + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
                         + "; build the reference as the model was built (same class and config)")
    elements = 0
    with torch.no_grad():
        for name, shape, dtype in manifest[0]:
            if name not in targets:
                continue  # in the reference only (e.g. a buffer the binding removed): nothing to fill
            if rank == 0:
                full = ref[name].detach().to(device)
            else:
                full = torch.empty(shape, dtype=dtype, device=device)
            if distributed:
                dist.broadcast(full, src=src, group=group)
            if name in experts:
                first, count = experts[name]
                full = full[first:first + count]
            _copy_part(targets[name], full)
            elements += full.numel()
    return {"tensors": len(targets), "elements": elements}


def _expert_blocks(model: nn.Module) -> dict[str, tuple[int, int]]:
    """Per expert-parallel parameter name, the block of experts this rank holds (first, count)."""
    out = {}
    for name, m in model.named_modules():
        info = getattr(m, "veomni_ops_experts", None)
        if isinstance(info, dict):
            for p in ("gate_up_proj", "down_proj"):
                out[f"{name}.{p}" if name else p] = (int(info["first"]), int(info["local"]))
    return out


def _copy_part(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy ``full`` into ``target``: a DTensor (an FSDP2 shard) takes its own part of it."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):
        local = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
        target.to_local().copy_(local.to_local())
    else:
        target.copy_(full)
