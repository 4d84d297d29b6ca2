"""Glue between veomni-flash and transformers 5.x.

Two things, both idempotent:

1. :func:`register_attention` puts an attention function into transformers'
   ``AttentionInterface`` *and* the flash mask builder into its ``AttentionMaskInterface``
   under the same name. The second half matters: for a name the mask interface does not
   know, ``masking_utils._preprocess_mask_arguments`` returns no mask at all, so a padded
   batch would reach the kernel with ``attention_mask=None`` and padding would be attended
   to. Registered with ``flash_attention_mask`` the model passes the 2-D ``[B, S]`` padding
   mask (None when nothing is padded), which the flash adapters unpad.
   :func:`register_flash_attention` does this for our adapters under ``flash_attention_N``
   and VeOmni's ``veomni_flash_attention_N_with_sp``.

2. :func:`patch_hub_kernel_loader` (VeOmni's transformers-5 compatibility adapter). At model
   init transformers preloads flash kernels with
   ``modeling_flash_attention_utils._lazy_imports(config._attn_implementation)``. It has
   branches for ``flash_attention_2/3/4``; any other name containing "flash" (VeOmni's
   ``veomni_flash_attention_N_with_sp``) falls through to the kernel hub,
   ``integrations.hub_kernels.load_and_register_attn_kernel``, which returns None for a name
   that is not a hub repo, and ``_lazy_imports`` raises "Could not find the currently
   requested flash attention implementation". The patch answers those names with the local
   flash package (an object with ``flash_attn_func`` / ``flash_attn_varlen_func``) and leaves
   every other name to the original loader unchanged. ``_lazy_imports`` imports the loader
   from its module at call time, so replacing the module attribute is enough. ``paged|``
   variants of VeOmni's names are not handled.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable, Iterable
from typing import Any

from .packages import NAME_TO_VERSION, PACKAGES, VEOMNI_NAMES, version_for

_MISSING = object()

#: name -> (previous attention function, previous mask function) before our first registration.
_saved: dict[str, tuple[Any, Any]] = {}
_original_loader: Callable[..., Any] | None = None


def _transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def _interfaces() -> tuple[Any, Any, Callable[..., Any]]:
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError as e:  # transformers < 4.48 or not installed
        raise ImportError(
            f"veomni_flash.transformers_adapter needs transformers>=5.0 with AttentionInterface and "
            f"masking_utils.AttentionMaskInterface ({e}); pip install 'transformers>=5.0'"
        ) from e
    return AttentionInterface, AttentionMaskInterface, flash_attention_mask


def register_attention(name: str, fn: Callable[..., Any], mask_function: Callable[..., Any] | None = None) -> None:
    """Register ``fn`` as transformers attention ``name``, with the flash mask builder
    (``masking_utils.flash_attention_mask``: 2-D padding mask or None) unless ``mask_function``
    is given. Registering again replaces the function; the state before the first
    registration is kept for :func:`restore`."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"attention name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise TypeError(f"attention function for {name!r} must be callable, got {type(fn).__name__}")
    attn_iface, mask_iface, flash_mask = _interfaces()
    if name not in _saved:
        _saved[name] = (
            attn_iface._global_mapping.get(name, _MISSING),
            mask_iface._global_mapping.get(name, _MISSING),
        )
    attn_iface.register(name, fn)
    mask_iface.register(name, mask_function if mask_function is not None else flash_mask)


def attention_function(version: int) -> Callable[..., Any]:
    """Our adapter for FA ``version``; imports the flash package (ImportError naming it if missing)."""
    if version not in PACKAGES:
        raise ValueError(f"unknown flash-attention version {version!r}; known: {sorted(PACKAGES)}")
    mod = importlib.import_module(f"veomni_flash.kernels.fa{version}")
    return getattr(mod, f"flash_attention_{version}")


def register_flash_attention(version: int, names: Iterable[str] | None = None) -> list[str]:
    """Register the FA ``version`` adapter under ``names`` (default: ``flash_attention_{version}``
    and ``veomni_flash_attention_{version}_with_sp``) and patch the hub loader. Returns the names.

    The flash package is imported now, so a missing one fails here, not at the first forward.
    """
    fn = attention_function(version)
    pkg = PACKAGES[version]
    names = [pkg.kernel_name, pkg.veomni_name] if names is None else list(names)
    for n in names:
        if NAME_TO_VERSION.get(n, version) != version:
            raise ValueError(f"{n!r} names flash-attention {NAME_TO_VERSION[n]}, not {version}")
        register_attention(n, fn)
    patch_hub_kernel_loader()
    return names


def local_flash_kernel(name_or_version: str | int) -> types.SimpleNamespace:
    """The kernel-like object transformers' flash preload wants for one of our names: a namespace
    with ``flash_attn_func``, ``flash_attn_varlen_func`` and ``flash_attn_with_kvcache`` (None
    where the package has none, e.g. FA4), taken straight from the flash package."""
    from .kernels._common import load_flash_backend

    version = name_or_version if isinstance(name_or_version, int) else version_for(name_or_version)
    be = load_flash_backend(version)
    return types.SimpleNamespace(
        flash_attn_func=be.flash_attn_func,
        flash_attn_varlen_func=be.flash_attn_varlen_func,
        flash_attn_with_kvcache=be.flash_attn_with_kvcache,
        __name__=f"veomni_flash.local.{be.name}",
    )


def _patched_loader(attn_implementation: str, *args: Any, **kwargs: Any) -> Any:
    version = VEOMNI_NAMES.get(attn_implementation)
    if version is not None:
        # Our private names are no hub repos: answer with the local package. The attention
        # function itself stays whatever was registered under the name (no re-registration).
        return local_flash_kernel(version)
    assert _original_loader is not None
    return _original_loader(attn_implementation, *args, **kwargs)


_patched_loader.__veomni_flash__ = True  # type: ignore[attr-defined]


def patch_hub_kernel_loader() -> bool:
    """Make ``transformers.integrations.hub_kernels.load_and_register_attn_kernel`` answer
    VeOmni's ``veomni_flash_attention_N_with_sp`` names locally. Idempotent. Only on
    transformers >= 5 (returns False and changes nothing on older versions)."""
    global _original_loader
    if _transformers_major() < 5:
        return False
    hub: Any = importlib.import_module("transformers.integrations.hub_kernels")
    current = getattr(hub, "load_and_register_attn_kernel", None)
    if current is None:
        raise ImportError(
            "transformers.integrations.hub_kernels.load_and_register_attn_kernel is missing in transformers "
            f"{importlib.import_module('transformers').__version__}; veomni-flash's loader patch was written "
            "against 5.x, where _lazy_imports calls it for non-native flash names"
        )
    if getattr(current, "__veomni_flash__", False):
        return True
    _original_loader = current
    hub.load_and_register_attn_kernel = _patched_loader
    return True


def restore() -> None:
    """Undo :func:`register_attention` / :func:`patch_hub_kernel_loader` (for tests)."""
    global _original_loader
    if _saved:
        attn_iface, mask_iface, _ = _interfaces()
        for name, (fn, mask) in _saved.items():
            for iface, old in ((attn_iface, fn), (mask_iface, mask)):
                if old is _MISSING:
                    iface._global_mapping.pop(name, None)
                else:
                    iface._global_mapping[name] = old
        _saved.clear()
    if _original_loader is not None:
        hub: Any = importlib.import_module("transformers.integrations.hub_kernels")
        hub.load_and_register_attn_kernel = _original_loader
        _original_loader = None
