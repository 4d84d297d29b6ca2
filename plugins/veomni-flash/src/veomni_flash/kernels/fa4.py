"""FlashAttention-4 as a transformers attention function (the ``flash_attention_4`` kernel).

Importing this module imports the flash package (``flash_attn.cute``); if it is missing, the
import raises an ImportError naming the distribution to install, which is what resolution
reports. FA4 has no dropout: a non-zero dropout while training raises ValueError. Its entry points
return ``(out, lse)``; the adapter keeps ``out``. With flash-attn-4 alone, ``flash_attn`` is a
namespace package holding only ``cute``; only ``flash_attn.cute`` is used, so that works.
"""

from __future__ import annotations

from ._common import load_flash_backend
from .attention import attention_function

BACKEND = load_flash_backend(4)

flash_attention_4 = attention_function(BACKEND, "flash_attention_4", __name__)
