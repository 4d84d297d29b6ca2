"""What resolution resolves for: a :class:`Target`.

A target is the device, the model's dtype, its :class:`Mode` (training or inference, eager or
under ``torch.compile``), what the model needs per op (the variants, see :class:`Need`), the
features its places need honoured and what its parallel layout needs. ``resolve(config, target)``
turns a config into a plan for it; ``veomni_ops.apply`` builds one target from the model it binds.

Both are plain values, checked when made: a contradictory mode, an unknown op or an unknown
variant is refused at once, with what to write instead.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Union

from .device import DeviceInfo, current_device
from .spec import OPS


class Mode(enum.Flag):
    """How the model runs: ``TRAINING`` (every kernel needs a backward) or ``INFERENCE``, and
    ``EAGER`` or ``COMPILE`` (under ``torch.compile``: only kernels whose spec says
    ``supports_compile``). Combine one of each with ``|``; an axis left out takes its default
    (training, eager). Both ends of one axis contradict each other, and such a mode is refused
    (:class:`ValueError`) however it is made: ``Mode.TRAINING | Mode.INFERENCE``,
    ``Mode.EAGER | Mode.COMPILE``, ``Mode(value)``."""

    TRAINING = enum.auto()
    INFERENCE = enum.auto()
    EAGER = enum.auto()
    COMPILE = enum.auto()

    @classmethod
    def _missing_(cls, value: object) -> Mode | None:
        if isinstance(value, int):
            for a, b, why in _AXES:
                if value & a.value and value & b.value:
                    raise ValueError(f"Mode {a.name} | {b.name} contradicts itself: {why}")
        return super()._missing_(value)

    @classmethod
    def of(cls, *, training: bool = True, compile: bool = False) -> Mode:
        """The mode of the two booleans resolution and ``apply`` take."""
        return (cls.TRAINING if training else cls.INFERENCE) | (cls.COMPILE if compile else cls.EAGER)

    @property
    def training(self) -> bool:
        """Kernels need a backward (the default: not ``INFERENCE``)."""
        return Mode.INFERENCE not in self

    @property
    def compile(self) -> bool:
        """The model runs under ``torch.compile``."""
        return Mode.COMPILE in self

    @property
    def execution(self) -> str:
        """``"compile"`` or ``"eager"``: how a plan, a lock and ``veomni-ops`` name the mode."""
        return "compile" if self.compile else "eager"

    def filled(self) -> Mode:
        """This mode with both axes said (an axis left out takes its default)."""
        return Mode.of(training=self.training, compile=self.compile)

    def __str__(self) -> str:
        return f"{self.execution} {'training' if self.training else 'inference'}"


#: The two ends of each axis of a :class:`Mode`, and why they cannot go together.
_AXES = (
    (Mode.TRAINING, Mode.INFERENCE, "a run is training (kernels need a backward) or inference (forward only), not "
                                    "both; keep one of Mode.TRAINING, Mode.INFERENCE"),
    (Mode.EAGER, Mode.COMPILE, "a model runs eagerly or under torch.compile, not both; keep one of Mode.EAGER, "
                               "Mode.COMPILE"),
)


@dataclass(frozen=True)
class Need:
    """One thing a model needs of an op: the variants it accepts, preferred first.

    ``prefer``: a kernel ``auto`` takes where it would choose another (the model asked for it,
    as a model built with ``attn_implementation="eager"`` does); the entry's reason is ``why``.
    ``fallback``: a kernel taken where the one the config names is refused for these variants
    (the causal-LM head's logits path takes the reference's); the plan's notes say so, ending
    with ``why``.
    """

    variants: tuple[str, ...]
    prefer: str | None = None
    fallback: str | None = None
    why: str = ""

    @classmethod
    def of(cls, op: str, need: Union[str, Sequence[str], Need]) -> Need:
        """``need`` (a variant, variants in order of preference, or a :class:`Need`) as a Need, its
        variants checked against ``op``'s."""
        got = need if isinstance(need, Need) else Need((need,) if isinstance(need, str) else tuple(need))
        for v in got.variants:
            if v not in OPS[op]:
                raise ValueError(f"op {op} has no variant {v!r}; its variants: {', '.join(OPS[op])}")
        if not got.variants:
            raise ValueError(f"a need of op {op} names no variant; its variants: {', '.join(OPS[op])}")
        return got


#: What a model needs per op: a list of requirements, each a variant, a tuple of acceptable
#: variants in order of preference (e.g. ``("fused_linear", "logits")``), or a :class:`Need`.
Needs = Mapping[str, Sequence[Union[str, tuple[str, ...], Need]]]


def checked_ops(what: str, ops: Iterable[str]) -> None:
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ValueError(f"unknown op(s) in {what}: {unknown}; known: {', '.join(OPS)}")


GIB = 2**30


@dataclass(frozen=True, init=False)
class MemoryBudget:
    """The device memory a job can give its kernels: ``free_bytes``, and per op the shapes a
    kernel's :attr:`~veomni_ops.spec.KernelSpec.extra_memory` takes (``cross_entropy``: ``tokens``,
    ``hidden``, ``vocab``, ``itemsize``). ``auto`` passes over a kernel whose extra memory at
    these shapes exceeds ``free_bytes``; an op without shapes here is not checked::

        MemoryBudget(2**30, shapes={"cross_entropy": {"tokens": 32768, "hidden": 2560, "vocab": 151936,
                                                      "itemsize": 2}})
    """

    free_bytes: int
    shapes: Mapping[str, Mapping[str, int]]

    def __init__(self, free_bytes: int, shapes: Mapping[str, Mapping[str, int]] | None = None):
        if not isinstance(free_bytes, int) or isinstance(free_bytes, bool) or free_bytes < 0:
            raise ValueError(f"MemoryBudget.free_bytes must be a non-negative int (bytes), got {free_bytes!r}")
        shapes = shapes or {}
        checked_ops("MemoryBudget shapes", shapes)
        norm: dict[str, Mapping[str, int]] = {}
        for op, dims in shapes.items():
            bad = {k: v for k, v in dims.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0}
            if bad:
                raise ValueError(f"MemoryBudget shapes of {op}: each must be a non-negative int, got {bad}")
            norm[op] = dict(dims)
        object.__setattr__(self, "free_bytes", free_bytes)
        object.__setattr__(self, "shapes", norm)

    def describe(self) -> str:
        """``"1.00 GiB free on the device"``."""
        return f"{self.free_bytes / GIB:.2f} GiB free on the device"


@dataclass(frozen=True, init=False)
class Target:
    """What resolution resolves for: ``device`` (a :class:`~veomni_ops.device.DeviceInfo`, a
    string such as ``"cuda:9.0"``, or ``None``: this machine's, or ``VEOMNI_OPS_DEVICE``), the
    model's ``dtype`` (e.g. ``"bfloat16"``; ``None``: any), its :class:`Mode`, and per op:
    ``needs`` (see :data:`Needs`; ``None``: every op and variant some kernel provides),
    ``features`` (what the model's places need honoured, e.g. ``{"attention": {"softcap"}}``) and
    ``parallel`` (what the job's parallel layout needs, e.g. ``{"attention": {"sp"}}``).

    ``leaves_to_model``: the model's own code is there for an op ``auto`` finds no usable kernel
    for: such an op is left out of the plan (``plan.left`` says why) instead of refused; a kernel
    the config names is still refused. ``apply`` resolves so.

    ``memory``: a :class:`MemoryBudget` (``None``: memory is not considered). ``auto`` then passes
    over a kernel whose declared extra memory does not fit the free bytes, for the next usable
    one; a kernel the config names is taken whatever it needs.
    """

    device: DeviceInfo
    dtype: str | None
    mode: Mode
    needs: Mapping[str, tuple[Need, ...]] | None
    features: Mapping[str, frozenset[str]]
    parallel: Mapping[str, frozenset[str]]
    leaves_to_model: bool
    memory: MemoryBudget | None

    def __init__(self, device: DeviceInfo | str | None = None, *, dtype: str | None = None, mode: Mode = Mode.TRAINING,
                 needs: Needs | None = None, features: Mapping[str, Iterable[str]] | None = None,
                 parallel: Mapping[str, Iterable[str]] | None = None, leaves_to_model: bool = False,
                 memory: MemoryBudget | None = None):
        if not isinstance(mode, Mode):
            raise TypeError(f"Target(mode=...) takes a veomni_ops.Mode (e.g. Mode.TRAINING | Mode.COMPILE), "
                            f"got {mode!r}")
        if memory is not None and not isinstance(memory, MemoryBudget):
            raise TypeError(f"Target(memory=...) takes a veomni_ops.MemoryBudget, got {memory!r}")
        if needs is not None:
            checked_ops("needs", needs)
        features = features or {}
        checked_ops("features", features)
        put = object.__setattr__
        put(self, "device", current_device(device))
        put(self, "dtype", dtype)
        put(self, "mode", mode.filled())
        put(self, "needs", None if needs is None else {op: tuple(Need.of(op, n) for n in want)
                                                       for op, want in needs.items()})
        put(self, "features", {op: frozenset(f) for op, f in features.items()})
        put(self, "parallel", {op: frozenset(p) for op, p in (parallel or {}).items()})
        put(self, "leaves_to_model", leaves_to_model)
        put(self, "memory", memory)
