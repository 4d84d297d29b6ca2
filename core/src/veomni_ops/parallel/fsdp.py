"""FSDP2 (``torch.distributed.fsdp.fully_shard``) over the job's data-parallel ranks.

``fully_shard`` goes on every expert module first (over the ranks that own the same experts,
when ``ep > 1``), then on every decoder layer (the model's ``_no_split_modules`` classes), then
on the root, all over the ``dp_shard x sp`` ranks. Gradients are *summed* (divide factor 1):
every rank's loss is already its share of the global loss (normalised by the global token
count), so the sum is the single-process gradient.

Mixed precision follows the job's dtype: for bfloat16/float16 the sharded parameters are kept
in float32 (the optimizer's master copy), gathered and computed in the job's dtype, and
gradients are reduced in float32. For float32 nothing is cast.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

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


def shard_model(model: nn.Module, dense_mesh: DeviceMesh, compute_dtype: torch.dtype,
                expert_modules: Iterable[nn.Module] = (), expert_mesh: DeviceMesh | None = None) -> nn.Module:
    """Apply FSDP2 to ``model`` in place (see the module docstring). Returns ``model``."""
    fully_shard, MixedPrecisionPolicy, FSDPModule = _fsdp()
    if compute_dtype in (torch.bfloat16, torch.float16):
        model.to(torch.float32)  # the sharded master copy
        mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    for m in expert_modules:
        fully_shard(m, mesh=expert_mesh, mp_policy=mp)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=dense_mesh, mp_policy=mp)
    fully_shard(model, mesh=dense_mesh, mp_policy=mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return model


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind an FSDP-sharded one (a collective over its mesh); others as they are."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t
