"""Function surgery for binding: copies of library functions with other globals, and who wrote a method.

Binding never mutates a module-level object. Where a transformers function calls a
module-level helper (``apply_rotary_pos_emb``, the ``ALL_ATTENTION_FUNCTIONS`` table), the
bound module runs a *copy* of that function whose globals name the plan's kernels.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Hashable, Mapping
from typing import Any

#: Modules whose classes binding may replace methods of: transformers itself, and the
#: ``trust_remote_code`` modules it loads (``transformers_modules.<repo>``).
LIBRARY_PREFIXES = ("transformers.", "transformers_modules.")
#: VeOmni's model classes: generated copies of transformers' modeling code, with VeOmni's
#: kernel slots (``OpSlot``) in them (``veomni/models/transformers/<model>/generated/
#: patched_modeling_<model>_<device>.py``). Library code too: binding replaces their methods
#: as it does transformers' (each slot's code is replaced with the method that holds it).
GENERATED_LIBRARY = re.compile(r"^veomni\.models\.transformers\.\w+\.generated\.patched_modeling_\w+$")


class RebindError(ValueError):
    """A function cannot be copied with other globals."""


def copy_with_globals(fn: Callable[..., Any], overrides: Mapping[str, Any],
                      memo: dict[Hashable, Any] | None = None, code: types.CodeType | None = None) -> Callable[..., Any]:
    """A copy of ``fn`` whose module globals are overridden; nothing module-level is changed.

    A decorated function (``functools.wraps``: ``fn.__wrapped__`` is the function it wraps)
    is copied layer by layer: the innermost function gets the new globals, and each wrapper
    is copied with the closure cell that held the function below it pointing at the copy.
    The decorators' own code (transformers' ``deprecate_kwarg``, say) still runs.

    The innermost copy runs a code object of its own (equal to ``fn``'s, not the same object).
    torch.compile needs that: dynamo caches its work per code object and keeps the compiled
    pieces of a frame it splits (a graph break) in that frame's globals; a second function
    with the same code but other globals would hit the cache and not find them (``NameError:
    __compiled_fn_...``). ``memo`` (one dict per binding): copies of the same function with the
    same override objects are one function, so the layers of a model share one compiled code.

    ``code``: the innermost copy runs this code object instead of a copy of its own (a rewritten
    body of the same function, with the same free variables), inside the same decorators.
    """
    key = (id(fn), tuple(sorted((k, id(v)) for k, v in overrides.items())), id(code))
    if memo is not None and key in memo:
        return memo[key][0]
    inner = getattr(fn, "__wrapped__", None)
    new = _copy_plain(fn, overrides, code) if inner is None else _copy_wrapper(fn, inner, overrides, code)
    if memo is not None:
        memo[key] = (new, fn, tuple(overrides.values()), code)  # the objects whose ids make the key stay alive
    return new


def _copy_wrapper(fn: Callable[..., Any], inner: Callable[..., Any], overrides: Mapping[str, Any],
                  code: types.CodeType | None) -> Callable[..., Any]:
    cells = fn.__closure__ or ()
    held = [i for i, c in enumerate(cells) if _cell_contents(c) is inner]
    if len(held) != 1:
        raise RebindError(
            f"{fn.__module__}.{fn.__qualname__} is wrapped by a decorator that does not keep the wrapped function "
            "in its closure; veomni-ops cannot redirect the globals it calls"
        )
    new_inner = copy_with_globals(inner, overrides, code=code)
    new_cells = tuple(types.CellType(new_inner) if i == held[0] else c for i, c in enumerate(cells))
    new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, new_cells)
    new.__dict__.update(fn.__dict__)
    new.__wrapped__ = new_inner  # type: ignore[attr-defined]  # what functools.wraps sets
    _copy_names(fn, new)
    return new


def code_names(fn: Callable[..., Any]) -> set[str]:
    """Global names the (innermost) function's code refers to."""
    return set(inspect.unwrap(fn).__code__.co_names)


def function_globals(fn: Callable[..., Any]) -> dict[str, Any]:
    return inspect.unwrap(fn).__globals__


def owner(cls: type, method: str) -> type | None:
    """The class in ``cls``'s MRO that defines ``method`` (``None`` if none does)."""
    for c in cls.__mro__:
        if method in c.__dict__:
            return c
    return None


def _is_library(c: type) -> bool:
    mod = c.__module__
    return mod.startswith(LIBRARY_PREFIXES) or mod == "transformers" or GENERATED_LIBRARY.match(mod) is not None


def library_method(cls: type, method: str) -> Callable[..., Any]:
    """``method`` as the nearest library class in ``cls``'s MRO defines it (a user's override
    skipped), so that what a module *is* can be read even when a subclass changed it."""
    for c in cls.__mro__:
        if method in c.__dict__ and _is_library(c):
            return c.__dict__[method]
    return getattr(cls, method)


def user_override(cls: type, method: str) -> str | None:
    """If ``cls.method`` is written outside transformers (a user's subclass or model), its
    qualified name, e.g. ``"my_pkg.models.MyQwen3.forward"``; ``None`` if transformers wrote it."""
    c = owner(cls, method)
    if c is None or c is object:
        return None
    if _is_library(c):
        return None
    return f"{c.__module__}.{c.__qualname__}.{method}"


_EMPTY = object()


def _cell_contents(cell) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _EMPTY


def _copy_names(src, dst) -> None:
    dst.__module__ = src.__module__
    dst.__kwdefaults__ = src.__kwdefaults__
    dst.__qualname__ = src.__qualname__
    dst.__doc__ = src.__doc__


def _copy_plain(fn, overrides: Mapping[str, Any], code: types.CodeType | None = None):
    g = dict(fn.__globals__)
    g.update(overrides)
    # No ``__name__``: torch._dynamo resolves the globals of a function whose globals carry a
    # module name through that module (``sys.modules[__name__]``), which would read and guard
    # transformers' own ALL_ATTENTION_FUNCTIONS instead of ours; without it dynamo guards this
    # dict itself.
    g.pop("__name__", None)
    # A code object of its own: see copy_with_globals.
    new = types.FunctionType(fn.__code__.replace() if code is None else code, g, fn.__name__, fn.__defaults__,
                             fn.__closure__)
    _copy_names(fn, new)
    return new
