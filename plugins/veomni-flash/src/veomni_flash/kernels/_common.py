"""The helper the flash adapters share: import one flash-attention generation and expose its entry points.

A :class:`FlashBackend` is also what transformers' kernel-hub path expects from a kernel: an
object with ``flash_attn_func`` / ``flash_attn_varlen_func`` (and ``flash_attn_with_kvcache``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..packages import PACKAGES


@dataclass(frozen=True)
class FlashBackend:
    version: int
    module: Any
    flash_attn_func: Callable[..., Any]
    flash_attn_varlen_func: Callable[..., Any]
    flash_attn_with_kvcache: Callable[..., Any] | None = None

    @property
    def name(self) -> str:
        return f"flash_attention_{self.version}"

    @property
    def supports_dropout(self) -> bool:
        # Only FA2 kept attention dropout; FA3 and FA4 dropped it (no dropout_p argument).
        return self.version == 2


def _missing(version: int, detail: str, cause: BaseException | None = None) -> ImportError:
    pkg = PACKAGES[version]
    err = ImportError(
        f"{pkg.kernel_name} needs the {pkg.distribution!r} package (import {pkg.module}): {detail}. "
        f"Install it: {pkg.install}"
    )
    err.__cause__ = cause
    return err


def load_flash_backend(version: int) -> FlashBackend:
    """Import FA ``version`` (2, 3 or 4). A missing or broken package raises an ImportError
    that names the distribution to install."""
    if version not in PACKAGES:
        raise ValueError(f"unknown flash-attention version {version!r}; known: {sorted(PACKAGES)}")
    pkg = PACKAGES[version]
    try:
        mod = importlib.import_module(pkg.module)
    except ImportError as e:
        raise _missing(version, f"importing {pkg.module} failed ({type(e).__name__}: {e})", e) from e
    except Exception as e:  # a half-built extension raises OSError/RuntimeError at import
        raise _missing(version, f"importing {pkg.module} raised {type(e).__name__}: {e}", e) from e
    func = getattr(mod, "flash_attn_func", None)
    varlen = getattr(mod, "flash_attn_varlen_func", None)
    if func is None or varlen is None:
        where = getattr(mod, "__file__", None) or list(getattr(mod, "__path__", []))
        hint = ""
        if version == 2 and getattr(mod, "__file__", None) is None:
            # flash-attn-4 alone installs flash_attn/ as a namespace package holding only cute/.
            hint = " (this flash_attn is a namespace package, probably flash-attn-4's, not flash-attn 2.x)"
        raise _missing(
            version, f"{pkg.module} at {where} has no flash_attn_func / flash_attn_varlen_func{hint}"
        )
    return FlashBackend(
        version=version,
        module=mod,
        flash_attn_func=func,
        flash_attn_varlen_func=varlen,
        flash_attn_with_kvcache=getattr(mod, "flash_attn_with_kvcache", None),
    )
