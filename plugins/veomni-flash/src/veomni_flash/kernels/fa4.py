"""FlashAttention-4 as a transformers attention function (the ``flash_attention_4`` kernel).

Importing this module imports the flash package (``flash_attn.cute``); if it is missing, the
import raises an ImportError naming the distribution to install, which is what resolution
reports. FA4 has no dropout: a non-zero dropout while training raises ValueError. Its entry points
return ``(out, lse)``; the adapter keeps ``out``. With flash-attn-4 alone, ``flash_attn`` is a
namespace package holding only ``cute``; only ``flash_attn.cute`` is used, so that works.
"""

from __future__ import annotations

from typing import Any

import torch

from ._backend import load_flash_backend
from .attention import flash_attention_forward

BACKEND = load_flash_backend(4)


def flash_attention_4(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``[B, Hq, S, D]`` query, ``[B, Hk, Sk, D]`` key/value -> (``[B, S, Hq, D]``, None).

    See :mod:`veomni_flash.kernels.attention` for masks, packing, windows and GQA.
    """
    return flash_attention_forward(
        BACKEND,
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        sliding_window=sliding_window,
        softcap=softcap,
        **kwargs,
    )
