"""FlashAttention-3 as a transformers attention function (the ``flash_attention_3`` kernel).

Importing this module imports the flash package (``flash_attn_interface``); if it is missing, the
import raises an ImportError naming the distribution to install, which is what resolution
reports. FA3 has no dropout: a non-zero dropout while training raises ValueError.
"""

from __future__ import annotations

from ._common import load_flash_backend
from .attention import attention_function

BACKEND = load_flash_backend(3)

flash_attention_3 = attention_function(BACKEND, "flash_attention_3", __name__)
