"""FlashAttention-2 as a transformers attention function (the ``flash_attention_2`` kernel).

Importing this module imports the flash package (``flash_attn``); if it is missing, the
import raises an ImportError naming the distribution to install, which is what resolution
reports. FA2 is the only generation with attention dropout (applied only while ``module.training``).
"""

from __future__ import annotations

from ._common import load_flash_backend
from .attention import attention_function

BACKEND = load_flash_backend(2)

flash_attention_2 = attention_function(BACKEND, "flash_attention_2", __name__)
