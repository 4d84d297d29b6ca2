"""One registered kernel, ready to check: resolved by name for this machine (:func:`prepare`), or
why not (:class:`Unusable`: a skip); the dtypes to check it in, and each case's seed. Shared by
the runner (``veomni-ops check``), the compile check and the conformance base classes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..config import OP_TO_FIELD, OpsConfig
from ..device import DeviceError, DeviceInfo, current_device
from ..registry import RegisteredKernel, Registry
from ..resolve import ResolutionError, resolve
from ..spec import KernelSpec
from .execution import execution_device


def kernel_dtypes(spec: KernelSpec, dtypes: Iterable[str] | None = None) -> list[str]:
    if dtypes is None:
        return list(spec.dtypes)
    want = [str(d).removeprefix("torch.") for d in dtypes]
    return [d for d in spec.dtypes if d in want]


def case_seed(seed: int, index: int) -> int:
    """The seed of the ``index``-th case of a run seeded with ``seed`` (each case draws anew)."""
    return seed + 1000 * index


def resolve_kernel(rk: RegisteredKernel, registry: Registry, dev: DeviceInfo) -> Callable[..., Any]:
    """Resolve exactly ``rk`` by name (``load=True``); raises ResolutionError with the reason."""
    spec = rk.spec
    # The name a config writes for exactly this kernel: qualified where two distributions register it.
    fields: dict[str, Any] = {OP_TO_FIELD[spec.op]: registry.name_of(rk)}
    cfg = OpsConfig(**fields)
    plan = resolve(cfg, dev, needs={spec.op: [spec.variant]}, registry=registry, training=False, load=True)
    return plan.kernel(spec.op, spec.variant)


def refusal_reason(e: ResolutionError) -> str:
    return "; ".join(r.why for r in e.refusals) or str(e)


class Unusable(Exception):
    """The kernel cannot be checked here; the message says why (a skip, not a failure)."""


def prepare(registry: Registry, op: str, variant: str, name: str,
            device: str | DeviceInfo | None = None) -> tuple[RegisteredKernel, Callable[..., Any], torch.device]:
    """Resolve one registered kernel for checking here: ``(registered, kernel, torch device)``.

    Raises :class:`LookupError` if no such kernel is registered (a failure: the backend does
    not provide what it claims), :class:`Unusable` if it cannot run here (a skip).
    """
    rk = registry.get(op, variant, name)
    if rk is None:
        have = ", ".join(f"{k.spec.variant}:{k.spec.name}" for k in registry.for_op(op)) or "none"
        fails = "; ".join(f.describe() for f in registry.failures)
        raise LookupError(f"no kernel {name!r} is registered for {op}/{variant} (registered for {op}: {have})"
                          + (f"; plugins that failed to load: {fails}" if fails else ""))
    dev = current_device(device)
    try:
        run_on = execution_device(dev)
    except DeviceError as e:
        raise Unusable(str(e)) from None
    try:
        fn = resolve_kernel(rk, registry, dev)
    except ResolutionError as e:
        if dev.type != "cpu" and "cpu" in rk.spec.hardware.device_types:
            try:
                return rk, resolve_kernel(rk, registry, DeviceInfo("cpu", None, "cpu")), torch.device("cpu")
            except ResolutionError as e2:
                raise Unusable(refusal_reason(e2)) from None
        raise Unusable(refusal_reason(e)) from None
    return rk, fn, run_on
