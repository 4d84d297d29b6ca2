"""The helpers the Triton kernels share: the core's input checks bound to this backend
(:data:`CHECKS`), the device check (CUDA, or the CPU under ``TRITON_INTERPRET=1``), launch
heuristics."""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Literal

import torch
import triton
from veomni_ops.kernels.checks import BackendChecks, check_same_device, where

#: The core's checks for these kernels: float32/bfloat16/float16 (no float64).
CHECKS = BackendChecks("triton", kernels="veomni-triton's kernels")
_FLOAT_DTYPES = CHECKS.dtypes


def interpreter_active() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``).

    ``triton.jit`` decides interpreter vs. compiled mode when a kernel is *decorated*, i.e. when
    our kernel modules are imported, so what counts is the mode our kernels were built in, not
    the environment variable now. We read Triton's own knob where it exists (Triton >= 3.4
    parses the same truthy spellings it uses itself) and the variable otherwise.
    """
    return _INTERPRET_AT_IMPORT


def _read_interpret_flag() -> bool:
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    if runtime is not None and hasattr(runtime, "interpret"):
        return bool(runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


# Evaluated once, when the kernel modules (which import this one first) are imported and
# their @triton.jit decorators run.
_INTERPRET_AT_IMPORT = _read_interpret_flag()


def check_device(op: str, **tensors: torch.Tensor | None) -> torch.device:
    """All tensors (``None`` skipped) on one device, and a device these kernels can run on; returns it."""
    check_same_device(op, backend=CHECKS.backend, **tensors)
    dev = next(t for t in tensors.values() if t is not None).device
    if dev.type == "cuda":
        # Under TRITON_INTERPRET=1 CUDA tensors still work (the interpreter copies them to the
        # host and back, very slowly): that is Triton's debugging mode, chosen explicitly.
        return dev
    if dev.type == "cpu":
        if not interpreter_active():
            raise RuntimeError(
                f"{where(op, CHECKS.backend)}: got CPU tensors, but these are Triton GPU kernels (CUDA, sm80+). Move "
                "the tensors to a CUDA device, or, to test on a CPU, set TRITON_INTERPRET=1 before importing "
                "veomni_triton.kernels (Triton fixes the mode when the kernels are defined)"
            )
        return dev
    raise RuntimeError(
        f"{where(op, CHECKS.backend)}: device {dev} is not supported; these Triton kernels run on CUDA (sm80+) "
        "(or on the CPU under TRITON_INTERPRET=1 for testing)"
    )


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


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def eager_path(*tensors: torch.Tensor) -> bool:
    """True when the wrappers may call the raw launchers (through a lean ``autograd.Function``)
    instead of the ``torch.library`` custom op: not while Dynamo traces (the custom op is what
    ``torch.compile`` sees), and only for plain tensors (a tensor subclass, e.g. a FakeTensor
    under ``make_fx`` or a DTensor, needs the op's dispatch)."""
    if torch.compiler.is_compiling():
        return False
    for t in tensors:
        if type(t) not in _PLAIN_TENSORS:
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
    not _INTERPRET_AT_IMPORT
    and os.environ.get("VEOMNI_TRITON_FAST_LAUNCH", "1").strip().lower() not in ("0", "false", "no", "off")
)
#: key -> (launcher, function, packed metadata, constexpr tail), or None: Triton's path for that key
_LAUNCH_CACHE: dict[tuple, Any] = {}
_LAUNCH_CACHE_MAX = 4096
_I32 = range(-(2**31), 2**31)
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


class _NoFastPath(Exception):
    pass


def _arg_key(a: Any) -> object:
    t = type(a)
    if t in _TENSOR_TYPES:
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
        if type(a) in _TENSOR_TYPES:
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


def check_tensors(op: str, names: tuple[str, ...], tensors: tuple[torch.Tensor, ...]) -> int:
    """Every tensor a float tensor on one device these kernels run on; returns the device index
    (``get_device()``: -1 for the CPU). A handful of attribute reads on the good path; the
    detailed messages come from :data:`CHECKS` and :func:`check_device` on the bad one."""
    try:
        index = tensors[0].get_device()
        for t in tensors:
            if t.dtype not in _FLOAT_DTYPES or t.get_device() != index:
                break
        else:
            if index >= 0:
                if tensors[0].is_cuda:  # (another accelerator is refused by check_device below)
                    return index
            elif _INTERPRET_AT_IMPORT:  # testing mode: CPU tensors (not meta)
                for t in tensors:
                    if not t.is_cpu:
                        break
                else:
                    return index
    except AttributeError:
        pass
    for name, t in zip(names, tensors):
        CHECKS.check_tensor(t, name, op)
    for name, t in zip(names, tensors):
        CHECKS.check_float(t, name, op)
    check_device(op, **dict(zip(names, tensors)))
    raise AssertionError("unreachable: check_device accepts what the fast path accepted")


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
