"""How the Triton kernels are launched: grid arithmetic (:func:`next_pow2`, :func:`cdiv`,
:func:`num_sms`), the 2-D row layout they read (:func:`as_rows`), whether a wrapper may call its
raw launchers (:func:`eager_path`), the device a launch runs on (:func:`launch_device`) and
:func:`launch`, whose fast path skips Triton's per-launch dispatch. The input checks every kernel
shares are in :mod:`._common`."""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Literal

import torch
import triton

from ._common import interpreter_active


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (cached: no driver call per launch, no sync).

    Under the interpreter (CPU) a small stand-in keeps the number of programs low.
    """
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    return sm_count(index)


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``max(n, 1)``, in plain Python: ``triton.next_power_of_2`` and
    ``triton.cdiv`` are ``constexpr_function`` wrappers in recent Triton, several microseconds
    a call on the host."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.cache
def sm_count(index: int) -> int:
    """SMs of CUDA device ``index`` (``Tensor.get_device()``); ``-1`` (CPU, interpreter): a
    small stand-in that keeps the number of programs low. Cached: one driver query a device."""
    if index < 0:
        return 4
    return torch.cuda.get_device_properties(index).multi_processor_count


def as_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` as a 2-D ``[rows, n]`` tensor whose last dimension has stride 1.

    A view when the leading dimensions collapse into one stride (any contiguous tensor,
    row slices, ``[..., :n]`` of a wider buffer); a copy otherwise, and then only one,
    explicit ``.contiguous()``.
    """
    x2 = x.reshape(-1, n)  # a view whenever the strides allow it
    if x2.stride(-1) != 1 and n > 1:
        x2 = x2.contiguous()
    return x2


#: The tensor types a launch takes as they are (no subclass: a FakeTensor or DTensor needs the
#: custom op's dispatch; the fast launch path keys and passes only these).
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def eager_path(*tensors: torch.Tensor) -> bool:
    """True when the wrappers may call the raw launchers (through a lean ``autograd.Function``)
    instead of the ``torch.library`` custom op: not while Dynamo traces (the custom op is what
    ``torch.compile`` sees), and only for plain tensors (a tensor subclass, e.g. a FakeTensor
    under ``make_fx`` or a DTensor, needs the op's dispatch)."""
    if torch.compiler.is_compiling():
        return False
    for t in tensors:
        if type(t) not in PLAIN_TENSORS:
            return False
    return True


def other_device(index: int):
    """``None`` when CUDA device ``index`` (``Tensor.get_device()``, -1 for the CPU) is the
    current one, which is the usual case and costs no context manager; else a
    ``torch.cuda.device`` context to launch under (Triton launches on the current device)."""
    if index < 0 or index == torch.cuda.current_device():
        return None
    return torch.cuda.device(index)


def launch(index: int, kernel, grid: tuple, *args, **meta) -> None:
    """``kernel[grid](*args, **meta)`` on CUDA device ``index``, entering a device context only
    when that device is not the current one.

    On the current CUDA device a launch whose arguments specialise as an earlier one did goes
    straight to the compiled kernel's launcher (see :func:`_fast_launch`); the first launch of
    every specialisation, and every launch under the interpreter, goes through Triton's
    ``JITFunction.run``.
    """
    if index >= 0 and index == torch.cuda.current_device():
        if _FAST_LAUNCH:
            _fast_launch(index, kernel, grid, args, meta)
        else:
            kernel[grid](*args, **meta)
        return
    dev = other_device(index)
    if dev is None:
        kernel[grid](*args, **meta)
    else:
        with dev:
            kernel[grid](*args, **meta)


# ---------------------------------------------------------------- fast launch path
# Triton's ``JITFunction.run`` binds and specialises every argument, builds a cache key, checks
# globals, builds launch metadata and calls the (empty) launch hooks on every launch: 5-10 us
# of Python on a 2-core CPU machine (Triton 3.6 and 3.9 driven through a stand-in driver, the
# launcher stubbed), against 3-6 us here; and its launcher then calls ``data_ptr()`` and ``cuPointerGetAttribute``
# for every tensor argument, which an address passed as an int skips. For kernels of a few
# microseconds the host is most of the wall time. The fast path
# keeps, per (kernel, device, argument specialisation, constexprs and options), the compiled
# kernel that Triton itself returned from the first launch, and calls its launcher directly
# with the same arguments ``JITFunction.run`` passes it.
#
# The key refines Triton's own specialisation, so one key never maps to two compiled kernels:
# a tensor by dtype and 16-byte alignment of its address; an int by its width class
# (i32 / i64 / u64), whether it is 1 and whether it is a multiple of 16; a bool by value; a
# float by type; constexprs and launch options (``num_warps``...) by value. Anything else
# (tensor subclasses, tuples, unhashable constexprs), an active launch hook (Proton, or any
# hook in ``triton.knobs.runtime``), a pre-run hook on the kernel or an unexpected Triton
# version takes Triton's own path. Triton options read from its knobs at launch time (``debug``,
# instrumentation) are not part of the key: whoever flips those while running sets
# ``VEOMNI_TRITON_FAST_LAUNCH=0``, which turns the fast path off.
_FAST_LAUNCH = (
    not interpreter_active()
    and os.environ.get("VEOMNI_TRITON_FAST_LAUNCH", "1").strip().lower() not in ("0", "false", "no", "off")
)
#: key -> (launcher, function, packed metadata, constexpr tail), or None: Triton's path for that key
_LAUNCH_CACHE: dict[tuple, Any] = {}
_LAUNCH_CACHE_MAX = 4096
_I32 = range(-(2**31), 2**31)


class _NoFastPath(Exception):
    pass


def _arg_key(a: Any) -> object:
    t = type(a)
    if t in PLAIN_TENSORS:
        return a.dtype, a.data_ptr() % 16 == 0
    if t is int:
        return a == 1, a % 16 == 0, a in _I32, a < 2**63
    if t is bool:
        return a
    if t is float or a is None:
        return t
    raise _NoFastPath


def _launch_key(kernel, index: int, args: tuple, meta: dict) -> tuple[tuple, list]:
    """(the cache key, the arguments as the launcher takes them). Tensors go to the launcher as
    their addresses: it uses an int as the device pointer as it is, where for an object it calls
    ``data_ptr()`` and asks the driver about the pointer (``cuPointerGetAttribute``) on every
    launch; the wrappers checked the device already."""
    key: list = [kernel, index]
    call: list = []
    for a in args:
        if type(a) in PLAIN_TENSORS:
            p = a.data_ptr()
            key.append((a.dtype, p % 16 == 0))
            call.append(p)
        else:
            key.append(_arg_key(a))
            call.append(a)
    key += meta.items()
    return tuple(key), call


def _hooks_idle() -> bool:
    """No Triton launch hook is set (``None``, or an empty ``HookChain`` in Triton >= 3.5)."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None:
        return False
    for hook in (getattr(runtime, "launch_enter_hook", None), getattr(runtime, "launch_exit_hook", None)):
        if hook is not None and getattr(hook, "calls", True):
            return False
    return True


def _stream_getter():
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get if get is not None else (lambda index: torch.cuda.current_stream(index).cuda_stream)


_current_stream = _stream_getter()


def _fast_entry(kernel, compiled, args: tuple, meta: dict) -> tuple | None:
    """(launcher, function handle, packed metadata, constexpr tail) of ``compiled``, or ``None``
    when this Triton does not look as expected (then this key keeps Triton's path)."""
    names = getattr(kernel, "arg_names", None)
    if names is None or getattr(kernel, "pre_run_hooks", None) or len(args) > len(names):
        return None
    tail = []
    for name in names[len(args):]:
        if name not in meta:
            return None
        tail.append(meta[name])
    try:
        run = compiled.run  # the launcher (Triton >= 3.3: a property that loads the module once)
        function = compiled.function
        packed = compiled.packed_metadata
    except Exception:
        return None
    if not callable(run):
        return None
    return run, function, packed, tuple(tail)


def _fast_launch(index: int, kernel, grid: tuple, args: tuple, meta: dict) -> None:
    try:
        key, call = _launch_key(kernel, index, args, meta)
        entry: Any = _LAUNCH_CACHE.get(key, False)
    except (_NoFastPath, TypeError):  # (TypeError: an unhashable constexpr)
        kernel[grid](*args, **meta)
        return
    if entry and _hooks_idle():
        run, function, packed, tail = entry
        n = len(grid)
        try:
            run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, _current_stream(index), function, packed,
                None, None, None, *call, *tail)
            return
        except (TypeError, SystemError) as e:
            # the launcher refused the arguments (parsed before anything is launched): a Triton
            # whose launcher takes other arguments. This key goes back to Triton's path.
            _LAUNCH_CACHE[key] = None
            warnings.warn(
                f"veomni-triton: the fast launch path does not fit this Triton ({triton.__version__}): {e}; "
                f"{getattr(kernel, '__name__', kernel)} launches through triton's JITFunction.run",
                RuntimeWarning, stacklevel=3,
            )
    compiled = kernel[grid](*args, **meta)
    if entry is False:
        if len(_LAUNCH_CACHE) >= _LAUNCH_CACHE_MAX:
            _LAUNCH_CACHE.clear()
        _LAUNCH_CACHE[key] = _fast_entry(kernel, compiled, args, meta)


class _NullContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> Literal[False]:
        return False


_NULL = _NullContext()


def launch_device(t: torch.Tensor):
    """Context that makes ``t``'s CUDA device current for a Triton launch.

    Triton launches on the *current* device; entering ``torch.cuda.device`` costs a few
    microseconds, so it is done only when the tensor is elsewhere.
    """
    if t.device.type == "cuda" and t.device.index is not None and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return _NULL
