"""Stand-in for flash-attn 2.x (tests only): the real signatures, float64 math (see flash_reference)."""

from flash_reference import fa2_func as flash_attn_func
from flash_reference import fa2_varlen as flash_attn_varlen_func

__version__ = "2.8.3+standin"
__all__ = ["flash_attn_func", "flash_attn_varlen_func"]
