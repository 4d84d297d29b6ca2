"""Host (Python) time per call of the rms_norm / rotary / swiglu wrappers, ours and Liger's.

    python plugins/veomni-triton/gpu/host_overhead.py [--calls 10000] [--mode stub|real|both] [--json out.json]

What is measured: the wall time and the CPU time (this process) of ``--calls`` back-to-back
calls of the public function, divided by the number of calls, in microseconds (best of
three loops). On a shared, busy host read the CPU time.

* ``stub``: every Triton kernel of the measured modules is replaced by a no-op launcher
  (``kernel[grid](...)`` does nothing), so the number is the wrapper's own overhead:
  validation, dispatch, autograd bookkeeping, allocation of the outputs, launch
  configuration. Works on the CPU (needs ``TRITON_INTERPRET=1``, set here when there is no
  CUDA device, so that the wrappers accept CPU tensors; no kernel is interpreted) and on a GPU.
* ``real`` (CUDA only): real launches at tiny shapes, so the GPU finishes each kernel in a
  few microseconds and the loop is host bound: wrapper + Triton launch + CUDA driver.
  The GPU is synchronised once, after the loop.

Passes: ``fwd`` under ``torch.no_grad()``; ``fwd(grad)``: inputs require grad, the autograd
graph is recorded, no backward; ``fwd+bwd``: forward then ``torch.autograd.backward``
(includes the autograd engine's own cost, common to every implementation).
The ``floor`` row times a bare ``torch.empty_like`` of the rms_norm input: the host's speed
scale (every wrapper allocates at least one output).
Liger rows are printed when liger-kernel is importable (its backward needs CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.join(HERE, "..", "src"), os.path.join(HERE, "..", "..", "..", "core", "src")):
    _path = os.path.normpath(_path)
    if os.path.isdir(_path) and _path not in sys.path:
        sys.path.insert(0, _path)

CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
if not CUDA:
    # the wrappers accept CPU tensors only in interpreter mode (fixed when the kernels are defined)
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402  (after TRITON_INTERPRET is settled)
from triton.runtime.jit import KernelInterface  # noqa: E402


class _NoLaunch:
    """Stands in for a Triton kernel: ``k[grid](*args, **kw)`` returns at once."""

    def __getitem__(self, grid):
        return self._launch

    @staticmethod
    def _launch(*args, **kwargs):
        return None


_NO_LAUNCH = _NoLaunch()


@contextlib.contextmanager
def stubbed(module_names):
    """Replace every Triton kernel (module attribute) of the named modules by a no-op launcher."""
    saved = []
    for name in module_names:
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        for attr, obj in list(vars(mod).items()):
            if isinstance(obj, KernelInterface):
                saved.append((mod, attr, obj))
                setattr(mod, attr, _NO_LAUNCH)
    try:
        yield
    finally:
        for mod, attr, obj in saved:
            setattr(mod, attr, obj)


def per_call_us(fn, calls: int) -> tuple[float, float]:
    """(wall, CPU) microseconds a call; CPU time (this process) is the robust number on a busy host."""
    for _ in range(min(200, calls)):  # warm up: JIT compile, caches
        fn()
    if CUDA:
        torch.cuda.synchronize()
    best, best_cpu = float("inf"), float("inf")
    for _ in range(3):  # best of three loops: the least disturbed by the rest of the machine
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            fn()
        if CUDA:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return best / calls * 1e6, best_cpu / calls * 1e6


def cases(dev, dtype):
    """(op, impl name, kernel modules to stub, fn(*args), make(requires_grad) -> args)."""
    from veomni_triton.kernels import rms_norm as R
    from veomni_triton.kernels import rotary as RO
    from veomni_triton.kernels import swiglu as SW

    out = []

    def make_rms(rg):
        x = torch.randn(2, 8, 256, device=dev, dtype=dtype, requires_grad=rg)
        w = torch.ones(256, device=dev, dtype=dtype, requires_grad=rg)
        return (x, w, 1e-6)

    def make_rope(rg):
        q = torch.randn(2, 8, 4, 64, device=dev, dtype=dtype).transpose(1, 2).requires_grad_(rg)
        k = torch.randn(2, 8, 2, 64, device=dev, dtype=dtype).transpose(1, 2).requires_grad_(rg)
        cos = torch.randn(1, 8, 64, device=dev, dtype=dtype)
        return (q, k, cos, cos.clone())

    def make_swiglu(rg):
        g = torch.randn(16, 256, device=dev, dtype=dtype, requires_grad=rg)
        u = torch.randn(16, 256, device=dev, dtype=dtype, requires_grad=rg)
        return (g, u)

    # the machine's yardstick: one allocation of the rms_norm output, no Python wrapper
    out.append(("floor", "empty", [], lambda x, w, eps: torch.empty_like(x), make_rms))
    ours_mods = ["veomni_triton.kernels.rms_norm", "veomni_triton.kernels.rotary", "veomni_triton.kernels.swiglu"]
    out.append(("rms_norm", "triton", ours_mods, R.rms_norm_standard, make_rms))
    out.append(("rotary", "triton", ours_mods, RO.apply_rotary, make_rope))
    out.append(("swiglu", "triton", ours_mods, SW.silu_mul, make_swiglu))
    try:
        from liger_kernel.ops import rms_norm as LR
        from liger_kernel.ops import rope as LRO
        from liger_kernel.ops import swiglu as LSW

        liger_mods = ["liger_kernel.ops.rms_norm", "liger_kernel.ops.rope", "liger_kernel.ops.swiglu"]
        out.append(("rms_norm", "liger", liger_mods,
                    lambda x, w, eps: LR.LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", True, None), make_rms))
        out.append(("rotary", "liger", liger_mods, lambda q, k, c, s: LRO.LigerRopeFunction.apply(q, k, c, s),
                    make_rope))
        out.append(("swiglu", "liger", liger_mods, lambda g, u: LSW.LigerSiLUMulFunction.apply(g, u), make_swiglu))
    except Exception as e:
        print(f"(liger-kernel not measured: {type(e).__name__}: {e})")
    return out


def measure(op, impl, mods, fn, make, mode, calls):
    rows = []
    ctx = stubbed(mods) if mode == "stub" else contextlib.nullcontext()
    with ctx:
        for pas in ("fwd",) if op == "floor" else ("fwd", "fwd(grad)", "fwd+bwd"):
            rg = pas != "fwd"
            args = make(rg)
            leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            if pas == "fwd":

                def call(args=args):
                    with torch.no_grad():
                        fn(*args)

            elif pas == "fwd(grad)":

                def call(args=args):
                    fn(*args)

            else:
                with torch.no_grad():
                    probe = fn(*args)
                outs = probe if isinstance(probe, tuple) else (probe,)
                grads = [torch.ones_like(o) for o in outs]

                def call(args=args, leaves=leaves, grads=grads):
                    for t in leaves:
                        t.grad = None
                    o = fn(*args)
                    torch.autograd.backward(o if isinstance(o, tuple) else (o,), grads)

            try:
                us, cpu_us = per_call_us(call, calls)
                err = None
            except Exception as e:
                us, cpu_us, err = None, None, f"{type(e).__name__}: {e}"[:200]
                if os.environ.get("VERBOSE"):
                    traceback.print_exc()
            rows.append({"op": op, "impl": impl, "mode": mode, "pass": pas, "us_per_call": us, "cpu_us_per_call": cpu_us,
                         "error": err})
            shown = f"{us:9.2f} {cpu_us:9.2f}" if us is not None else f"      n/a  ({err})"
            print(f"{op:<9} {impl:<7} {mode:<5} {pas:<10} {shown}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--mode", default="both", choices=["stub", "real", "both"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda" if CUDA else "cpu")
    dtype = torch.bfloat16 if CUDA else torch.float32
    modes = ["stub", "real"] if args.mode == "both" else [args.mode]
    if not CUDA and "real" in modes:
        print("(no CUDA device: 'real' mode skipped; stub mode measures the wrappers on the CPU)")
        modes = [m for m in modes if m != "real"]
    name = torch.cuda.get_device_name() if CUDA else "cpu"
    print(f"device: {name}  torch {torch.__version__}  triton {triton.__version__}  calls {args.calls}")
    print(f"{'op':<9} {'impl':<7} {'mode':<5} {'pass':<10} {'wall_us':>9} {'cpu_us':>9}")
    rows = []
    for mode in modes:
        for op, impl, mods, fn, make in cases(dev, dtype):
            rows += measure(op, impl, mods, fn, make, mode, args.calls)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "triton": triton.__version__,
                       "calls": args.calls, "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
