"""The helper the flash adapters share: import one flash-attention generation and expose its entry points.

A :class:`FlashBackend` is also what transformers' kernel-hub path expects from a kernel: an
object with ``flash_attn_func`` / ``flash_attn_varlen_func`` (and ``flash_attn_with_kvcache``).
"""

from __future__ import annotations

import base64
import hashlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
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


def fa4_files_overwritten(mod: Any) -> str | None:
    """Why ``flash_attn.cute`` is not flash-attn-4's own code, or None.

    flash-attn 2.x wheels (2.8.3.post2 too) ship an older ``flash_attn/cute`` (its 0.1.0 prototype,
    21 files) at the paths flash-attn-4 installs: ``pip install flash-attn`` after flash-attn-4
    overwrites FA4's ``__init__.py``, ``interface.py`` and kernels with it (and uninstalling
    flash-attn deletes them). Compared: the imported ``flash_attn/cute/__init__.py`` against the
    hash flash-attn-4's RECORD gives for it. No flash-attn-4 metadata (a copy on ``PYTHONPATH``)
    or no hash recorded: nothing to compare, None.
    """
    try:
        dist = metadata.distribution(PACKAGES[4].distribution)
    except metadata.PackageNotFoundError:
        return None
    init = getattr(mod, "__file__", None)
    rec = next((f for f in dist.files or () if f.as_posix() == "flash_attn/cute/__init__.py"), None)
    if init is None or rec is None or rec.hash is None:
        return None
    try:
        digest = hashlib.new(rec.hash.mode, Path(init).read_bytes()).digest()
    except (OSError, ValueError):
        return None
    if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == rec.hash.value:
        return None
    return (
        f"{init} is not flash-attn-4 {dist.version}'s file (its RECORD hash differs): flash-attn 2.x ships an "
        "older flash_attn/cute and overwrites flash-attn-4's when installed after it. Reinstall flash-attn-4 "
        "last: pip install --force-reinstall --no-deps flash-attn-4"
    )


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
    if version == 4:
        why = fa4_files_overwritten(mod)
        if why is not None:
            raise _missing(version, why)
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
