"""Stand-in for flash-attn-3's flash_attn_interface (tests only)."""

from flash_reference import fa3_func as flash_attn_func
from flash_reference import fa3_varlen as flash_attn_varlen_func

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]
