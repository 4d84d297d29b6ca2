"""The types a refusal is made of: :class:`RefusalKind`, :class:`Problem`, :class:`Refusal` and
:class:`ResolutionError`.

Their own module, so that :mod:`.checks` (which makes problems and refusals) and
:mod:`.explain` (which words them and needs :class:`~.checks.OpRequest`) both import it and
neither imports the other in a circle. :mod:`.explain` and :mod:`veomni_ops.resolve`
re-export them.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import OP_TO_FIELD
from ..device import DeviceInfo

__all__ = ["Problem", "Refusal", "RefusalKind", "ResolutionError"]


class RefusalKind(enum.Enum):
    """Why a kernel was refused. A refusal's fix-it hint is chosen from its kind."""

    #: No installed plugin registers the name for the op.
    UNKNOWN_NAME = "unknown name"
    #: A bare name that two installed distributions register for the op.
    CONTESTED_NAME = "contested name"
    #: The name provides other variants of the op than the model needs.
    WRONG_VARIANT = "wrong variant"
    #: The name is qualified by a distribution that does not register it (others do).
    WRONG_DISTRIBUTION = "wrong distribution"
    #: The plugin that provides it was switched off (``VEOMNI_OPS_PLUGINS`` / ``VEOMNI_OPS_DISABLE``).
    SWITCHED_OFF = "switched off"
    #: The plugin that may provide it failed to load.
    PLUGIN_FAILED = "plugin failed"
    #: Its hardware requirement: another device type, or compute capability.
    DEVICE = "device"
    #: A distribution it requires is missing or of another version.
    REQUIREMENT = "requirement"
    #: It does not accept the dtype.
    DTYPE = "dtype"
    #: It has no backward, and training needs one.
    NO_BACKWARD = "no backward"
    #: It does not honour an optional feature the model needs (``spec.FEATURES``).
    FEATURE = "feature"
    #: It does not run under torch.compile, and this is compile mode.
    COMPILE = "compile"
    #: It does not run under a parallel layout the job needs (``spec.PARALLEL``).
    PARALLEL = "parallel"
    #: Its factory failed to import in this process.
    IMPORT = "import"
    #: ``auto``: no registered kernel is usable.
    NOTHING_USABLE = "nothing usable"


@dataclass(frozen=True)
class Problem:
    """Why one kernel cannot be used here: its kind, and the phrase that says it."""

    kind: RefusalKind
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Refusal:
    """One op the config asked for that cannot be had: what was asked, why not (``kind`` and
    ``why``), what is usable instead, and how to get what was asked (``how``)."""

    kind: RefusalKind
    op: str
    requested: str
    variants: tuple[str, ...]
    why: str
    available: tuple[str, ...]
    how: str
    cause: BaseException | None = None

    def describe(self) -> str:
        field = OP_TO_FIELD[self.op]
        avail = ", ".join(self.available) if self.available else "none"
        return (
            f"{field}={self.requested!r} (op {self.op}, variant {'/'.join(self.variants)}): {self.why}. "
            f"Usable here for {self.op}/{self.variants[0]}: {avail}. {self.how}"
        ).rstrip()


class ResolutionError(RuntimeError):
    """One or more ops of a config cannot be had on this device. ``refusals`` lists them all."""

    def __init__(self, refusals: Sequence[Refusal], device: DeviceInfo):
        self.refusals = tuple(refusals)
        self.device = device
        lines = [f"cannot resolve {len(self.refusals)} op(s) for device {device.describe()}:"]
        lines += [f"  - {r.describe()}" for r in self.refusals]
        super().__init__("\n".join(lines))
        for r in self.refusals:
            if r.cause is not None:
                self.__cause__ = r.cause
                break
