"""The compile check: does a kernel's ``supports_compile`` claim hold (:func:`check_compiles`)?
A kernel that breaks its contract fails with :class:`ConformanceFailure`. Light to import: torch
and the rest of the kit only when a check runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..device import DeviceInfo
    from ..registry import Registry


class ConformanceFailure(AssertionError):
    """A kernel disagrees with the reference (or broke the contract) on one case."""


def check_compiles(registry: Registry, op: str, variant: str, name: str, dtype: str | None = None, *,
                   device: str | DeviceInfo | None = None, probe: bool = False) -> str | None:
    """Verify a ``supports_compile=True`` claim: the kernel under ``torch.compile(fullgraph=True)``
    (backend ``aot_eager``: dynamo traces the forward, AOTAutograd the backward, which is where
    graph breaks and untraceable ops show up) gives the uncompiled result, forward and backward,
    on the op's first small case. Returns why it was not checked (a skip), ``None`` when it
    passed; raises :class:`ConformanceFailure` when the claim is false.

    ``device``: resolve for this device (default: this machine's). ``probe``: also try a kernel
    that declares ``supports_compile=False`` (does the claim still hold?); for such a kernel
    the outcome is returned as text, never raised."""
    import torch

    from .case_check import case_cotangents, grad_leaves, run_backward
    from .cases import TORCH_DTYPES, Builder, harness
    from .execution import interpreter_active
    from .prepare import Unusable, prepare

    try:
        rk, fn, run_on = prepare(registry, op, variant, name, device)
    except Unusable as e:
        return f"cannot run here: {e}"
    except LookupError as e:
        raise ConformanceFailure(str(e)) from None
    if not rk.spec.supports_compile and not probe:
        return f"{name} declares supports_compile=False (nothing to verify)"
    if interpreter_active() and not {"cpu", "any"} & set(rk.spec.hardware.device_types):
        # A GPU kernel running on the CPU through the Triton interpreter: not what compile traces on a GPU.
        return "TRITON_INTERPRET=1: the interpreter's launches are not what torch.compile traces on a GPU"
    h = harness(op)
    case = h.cases(variant, "small")[0]
    dt = dtype or rk.spec.dtypes[0]

    def run(call):
        inputs = case.build(Builder(0, TORCH_DTYPES[dt], run_on))
        leaves = grad_leaves(inputs, case.diff) if rk.spec.supports_backward else []
        outs = call(inputs)
        grads = []
        if leaves:
            run_backward(outs, leaves, case_cotangents(outs, [None] * len(outs), 0))
            grads = [t.grad for _, t in leaves]
        return outs, grads

    def verify() -> None:
        torch._dynamo.reset()
        compiled = torch.compile(lambda inputs: h.call(fn, inputs, False), fullgraph=True, backend="aot_eager")
        try:
            got, got_grads = run(compiled)
        except Exception as e:
            raise ConformanceFailure(
                f"{op}/{variant} {name!r} declares supports_compile=True but torch.compile(fullgraph=True) failed: "
                f"{type(e).__name__}: {str(e)[:600]}. Fix the graph break, or declare supports_compile=False."
            ) from e
        want, want_grads = run(lambda inputs: h.call(fn, inputs, False))
        for label, a, b in [*(("output", x, y) for x, y in zip(got, want)),
                            *(("gradient", x, y) for x, y in zip(got_grads, want_grads))]:
            if a is None or b is None:
                if a is not b:
                    raise ConformanceFailure(f"{op}/{variant} {name!r}: a {label} is None in one of compiled/eager only")
                continue
            tol = rk.spec.tolerance(dt)
            if not torch.allclose(a.float(), b.float(), atol=tol.atol, rtol=tol.rtol):
                raise ConformanceFailure(f"{op}/{variant} {name!r}: compiled {label} differs from the uncompiled one "
                                         f"(max |a-b| {(a.float() - b.float()).abs().max().item():.3g})")

    if rk.spec.supports_compile:
        verify()
        return None
    try:
        verify()
    except ConformanceFailure as e:
        cause = e.__cause__
        why = f"{type(cause).__name__}: {str(cause)[:300]}" if cause is not None else str(e)
        return f"declares supports_compile=False, and rightly ({why})"
    return "declares supports_compile=False, but compiles and matches eager (it could declare True)"
