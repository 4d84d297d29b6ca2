"""Stand-in for flash-attn-4's flash_attn.cute (tests only): returns (out, lse) like the real one."""

from flash_reference import fa4_func as flash_attn_func
from flash_reference import fa4_varlen as flash_attn_varlen_func

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]
