"""A workaround for Quack's GEMM epilogue fingerprinting where the CuTe DSL is installed outside
site-packages (what the MoE adapter's ``gemm_gated`` / ``gemm_dgated`` need; see
:func:`fingerprint_installed_dsl`)."""

from __future__ import annotations

import importlib

#: Top-level packages whose functions Quack's epilogue fingerprinting must treat as installed code.
_INSTALLED_PACKAGES = frozenset({"cutlass", "cuda", "tvm_ffi", "torch", "numpy", "einops", "triton"})


def fingerprint_installed_dsl() -> bool:
    """Make Quack's epilogue fingerprinting see the CuTe DSL as installed code, wherever it lives.

    Quack 0.6.5 (``quack.gemm_runtime.identity``) fingerprints every GEMM epilogue function when it
    is built (``import quack.epilogue.library``, which ``gemm_gated`` / ``gemm_dgated`` import at
    their first call): it recurses into the globals of every function the epilogue reaches, except
    functions it deems installed, i.e. whose file path contains ``site-packages`` or
    ``dist-packages`` (``_is_extern_function``). A DSL installed elsewhere (``pip install
    --target /tmp/cutlass``, as this project's GPU setup does) is recursed into, reaches the
    ContextVar ``_LOC_TRANSFORMS`` of ``cutlass/_mlir_helpers/op.py`` and raises "epilogue fn
    depends on <ContextVar name='_LOC_TRANSFORMS' ...> which has no fail-closed semantic key".
    This wraps ``_is_extern_function`` so that functions of the packages in
    :data:`_INSTALLED_PACKAGES` count as installed (fingerprinted by qualified name, as Quack
    intends for them). Nothing changes where they already live under site-packages. Returns True
    if the wrapper is in place (False: no such Quack module, e.g. the CPU stand-in).
    """
    try:
        identity = importlib.import_module("quack.gemm_runtime.identity")
    except Exception:  # noqa: BLE001 - no Quack, or one that fails to import: import_quack reports that
        return False
    original = getattr(identity, "_is_extern_function", None)
    if original is None:
        return False
    if getattr(original, "_veomni_installed_dsl", False):
        return True

    def is_extern(fn: object) -> bool:
        module = getattr(fn, "__module__", None) or ""
        if module.split(".")[0] in _INSTALLED_PACKAGES and getattr(fn, "__code__", None) is not None:
            return True
        return bool(original(fn))

    is_extern._veomni_installed_dsl = True  # type: ignore[attr-defined]
    setattr(identity, "_is_extern_function", is_extern)  # noqa: B010 - a module attribute mypy cannot see
    return True
