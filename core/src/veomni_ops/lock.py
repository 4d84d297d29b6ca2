"""Plan locks: ``auto`` by measurement on this machine (``veomni-ops tune`` writes them).

A plan lock is a JSON file that says, per op and variant request, which kernel ``auto`` takes,
because ``veomni-ops tune`` timed every usable candidate inside training steps of a job's
model on this device. Beside the choices it records what the measurement depends on: the
device (type, name, capability), the versions of torch, triton, transformers, veomni-ops and
every plugin whose kernels were measured, the mode (eager or compile), the dtype, the job's
shapes and every candidate's measured step times.

Matching. A lock is *in force* only where it matches: the same device type, name and compute
capability; the same installed versions of torch, triton, transformers, veomni-ops and of each
plugin it records; the same mode; and, where the resolution knows the model's dtype, the same
dtype. A lock that matches outranks the static priorities and the compile-mode preferences
(:mod:`.compile_policy`) for every op the config leaves on ``auto``; an op named in the config
is never replaced. The shapes are recorded, not checked: point each job at the lock tuned for
it.

Where ``auto`` finds a lock (first that applies):

1. passed explicitly: ``resolve(..., lock=PATH)``, ``apply(..., lock=PATH)``, ``--lock PATH``
   of ``veomni-ops train`` / ``resolve``. One that does not match is an error
   (:class:`LockMismatchError`), and so is a missing file.
2. a job YAML's top-level ``lock: PATH`` key (relative to the YAML's folder; ``veomni-ops
   tune`` writes there too), read by ``veomni-ops train``, ``tune`` and ``resolve``.
3. the environment variable ``VEOMNI_OPS_LOCK=PATH``.

A lock found the second or third way that does not match, or whose file does not exist yet,
is ignored with a :class:`LockWarning` naming the mismatch, and ``auto`` uses the static
priorities. A malformed lock file is always an error (it names the file and the fix).
``lock=False`` uses no lock at all (``veomni-ops tune`` times the static choice so).

This module imports no torch: versions are read from the installed distributions' metadata.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Literal, Union

from .device import DeviceInfo
from .spec import OPS

#: The environment variable naming a lock for every resolution that is passed none.
ENV_LOCK = "VEOMNI_OPS_LOCK"
#: What the file says it is, and the version of its format this veomni-ops reads and writes.
KIND = "veomni-ops plan lock"
FORMAT = 1
#: The libraries whose versions a lock records besides the plugins (key -> distributions to try).
LIBRARIES: Mapping[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "triton": ("triton", "pytorch-triton", "pytorch-triton-rocm"),
    "transformers": ("transformers",),
    "veomni-ops": ("veomni-ops",),
}


class LockError(ValueError):
    """A lock file cannot be read: missing, not JSON, another format, a field missing or wrong."""


class LockMismatchError(LockError):
    """A lock passed explicitly does not match this device, these versions or this mode."""

    def __init__(self, message: str, mismatches: Sequence[str]):
        super().__init__(message)
        self.problems = tuple(mismatches)


class LockWarning(UserWarning):
    """A lock found through a job's ``lock:`` key or ``VEOMNI_OPS_LOCK`` is not used (no such
    file, or it does not match here): ``auto`` uses the static priorities."""


class KernelNames:
    """The names of a kernel that has ``kernel``, ``distribution`` and ``variant`` attributes."""

    kernel: str
    distribution: str
    variant: str

    @property
    def qualified_name(self) -> str:
        return f"{self.kernel}@{self.distribution}"

    @property
    def full_name(self) -> str:
        """``kernel@distribution/variant``: one kernel name may provide several variants of an op."""
        return f"{self.qualified_name}/{self.variant}"


@dataclass(frozen=True)
class LockChoice(KernelNames):
    """What ``auto`` takes for one request of an op: the kernel (bare name and distribution)
    and the variant it provides, among the ``variants`` the model accepted (preferred first)."""

    op: str
    variants: tuple[str, ...]
    variant: str
    kernel: str
    distribution: str
    #: Why, in words: the measured step times (said in the plan's reason).
    why: str
    #: The static ``auto`` choice it was measured against (``name@distribution/variant``), if any.
    static: str | None = None
    #: Median step time with this kernel, and with the static choice, in milliseconds.
    step_ms: float | None = None
    static_step_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "variants": list(self.variants), "variant": self.variant, "kernel": self.kernel,
                "distribution": self.distribution, "why": self.why, "static": self.static, "step_ms": self.step_ms,
                "static_step_ms": self.static_step_ms}


@dataclass(frozen=True, eq=False)
class PlanLock:
    """A plan lock (see the module's docstring). ``source`` (where it was read from),
    ``origin`` (how it was named) and ``explicit`` are not part of the file."""

    device: Mapping[str, Any]
    versions: Mapping[str, Any]
    mode: str
    dtype: str | None
    choices: tuple[LockChoice, ...]
    shapes: Mapping[str, Any] = field(default_factory=dict)
    job: str | None = None
    created: str = ""
    method: Mapping[str, Any] = field(default_factory=dict)
    static_step_ms: float | None = None
    tuned_step_ms: float | None = None
    measurements: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<in memory>"
    origin: str = "lock="
    explicit: bool = True

    def choice(self, op: str, variants: Sequence[str]) -> LockChoice | None:
        """The choice for a request of ``op`` accepting ``variants``: one recorded for the same
        request first, else one whose chosen variant the request accepts; None if there is none."""
        fits = [c for c in self.choices if c.op == op and c.variant in variants]
        same = [c for c in fits if c.variants == tuple(variants)]
        best = same or fits
        return best[0] if best else None

    def describe(self) -> str:
        """One phrase for plans and messages: the file, how it was named, where it was tuned."""
        where = self.device.get("name") or self.device.get("type")
        when = f" {self.created[:10]}" if self.created else ""
        return f"{self.source} ({self.origin}; tuned{when} on {where}, {self.mode} mode)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND, "format": FORMAT, "created": self.created, "job": self.job, "mode": self.mode,
            "dtype": self.dtype, "device": dict(self.device), "versions": _plain(self.versions),
            "shapes": dict(self.shapes), "method": dict(self.method), "static_step_ms": self.static_step_ms,
            "tuned_step_ms": self.tuned_step_ms, "choices": [c.to_dict() for c in self.choices],
            "measurements": _plain(self.measurements),
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        write_json_atomic(path, self.to_dict())


def _plain(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as JSON to ``path`` so that an interruption leaves the old file or the new
    one, never half of one (a temporary file in the same folder, then a rename)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ----------------------------------------------------------------------------------------
# This machine: device and versions
# ----------------------------------------------------------------------------------------


def installed_version(*distributions: str) -> str | None:
    """The installed version of the first of ``distributions`` that is installed, else None."""
    for d in distributions:
        try:
            return metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    return None


def device_fingerprint(device: DeviceInfo) -> dict[str, Any]:
    return {"type": device.type, "name": device.name,
            "capability": list(device.capability) if device.capability else None}


def versions_here(plugins: Iterable[str]) -> dict[str, Any]:
    """The versions a lock records: torch, triton, transformers, veomni-ops, and ``plugins``
    (distribution names; veomni-ops itself is recorded once, above). None: not installed."""
    out: dict[str, Any] = {key: installed_version(*dists) for key, dists in LIBRARIES.items()}
    out["plugins"] = {d: installed_version(d) for d in sorted(set(plugins)) if d != "veomni-ops"}
    return out


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ----------------------------------------------------------------------------------------
# Matching
# ----------------------------------------------------------------------------------------


def mismatches(lock: PlanLock, device: DeviceInfo, *, compile: bool | None = None,
               dtype: str | None = None) -> list[str]:
    """Every way ``lock`` does not fit here, one phrase each; empty: it matches. ``compile`` and
    ``dtype``: the mode and dtype being resolved for (None: not checked)."""
    out: list[str] = []
    here = device_fingerprint(device)
    for key in ("type", "name", "capability"):
        want, have = lock.device.get(key), here[key]
        if want != have:
            out.append(f"device {key}: the lock was tuned on {_show(want)}, this is {_show(have)}")
    plugins = lock.versions.get("plugins") or {}
    now_versions = versions_here(plugins)
    for key in LIBRARIES:
        want, have = lock.versions.get(key), now_versions[key]
        if want != have:
            out.append(f"{key}: the lock was tuned with {_show_version(want)}, installed is {_show_version(have)}")
    for dist, want in plugins.items():
        have = now_versions["plugins"][dist]
        if want != have:
            out.append(f"plugin {dist}: the lock was tuned with {_show_version(want)}, installed is "
                       f"{_show_version(have)}")
    mode = None if compile is None else ("compile" if compile else "eager")
    if mode is not None and lock.mode != mode:
        out.append(f"mode: the lock was tuned in {lock.mode} mode, this resolves for {mode} mode")
    if dtype is not None and lock.dtype is not None and lock.dtype != dtype:
        out.append(f"dtype: the lock was tuned for {lock.dtype}, this model is {dtype}")
    return out


def _show(value: Any) -> str:
    if isinstance(value, list):
        return ".".join(map(str, value))
    return repr(value) if value is not None else "none"


def _show_version(v: Any) -> str:
    return str(v) if v is not None else "not installed"


# ----------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LockFile:
    """A lock named by its path, and how: ``explicit`` (``--lock``, ``lock=``: a missing or
    mismatched file is an error) or found (a job's ``lock:`` key, ``VEOMNI_OPS_LOCK``: ignored
    with a warning). ``origin`` says which, in messages."""

    path: str
    explicit: bool = True
    origin: str = "lock="


#: What ``resolve(..., lock=)`` and ``apply(..., lock=)`` accept: a lock, a path (explicit),
#: a :class:`LockFile`, ``None`` (``VEOMNI_OPS_LOCK`` if set) or ``False`` (no lock).
LockArg = Union[PlanLock, LockFile, str, os.PathLike, Literal[False], None]


def load_lock(path: str | os.PathLike[str], *, explicit: bool = True, origin: str = "lock=") -> PlanLock:
    """Read the lock at ``path``. Raises :class:`LockError` naming the file and the fix."""
    where = os.fspath(path)
    retune = "re-create it with veomni-ops tune JOB.yaml --out " + where
    try:
        with open(where) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise LockError(f"plan lock {where} ({origin}): no such file (looked in {os.getcwd()}); write one with "
                        f"veomni-ops tune JOB.yaml --out {where}") from None
    except (OSError, ValueError) as e:
        raise LockError(f"plan lock {where}: cannot be read as JSON ({e}); {retune}") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise LockError(f"plan lock {where}: not a plan lock (no \"kind\": \"{KIND}\"); {retune}")
    if data.get("format") != FORMAT:
        raise LockError(f"plan lock {where}: format {data.get('format')!r}, this veomni-ops reads format {FORMAT}; "
                        f"{retune} (or use the veomni-ops that wrote it)")
    try:
        return _from_dict(data, where, explicit, origin)
    except (KeyError, TypeError, ValueError) as e:
        raise LockError(f"plan lock {where}: malformed ({e}); {retune}") from None


def _from_dict(data: dict[str, Any], source: str, explicit: bool, origin: str) -> PlanLock:
    for key in ("device", "versions", "mode", "choices"):
        if key not in data:
            raise KeyError(f"no {key!r}")
    if data["mode"] not in ("eager", "compile"):
        raise ValueError(f"mode {data['mode']!r} is neither 'eager' nor 'compile'")
    choices = []
    for c in data["choices"]:
        op, variant = c["op"], c["variant"]
        if op not in OPS or variant not in OPS[op]:
            raise ValueError(f"choice {op}/{variant} is no op/variant of this veomni-ops")
        variants = tuple(c.get("variants") or (variant,))
        choices.append(LockChoice(op, variants, variant, str(c["kernel"]), str(c["distribution"]),
                                  str(c.get("why") or ""), c.get("static"), c.get("step_ms"),
                                  c.get("static_step_ms")))
    return PlanLock(device=dict(data["device"]), versions=dict(data["versions"]), mode=data["mode"],
                    dtype=data.get("dtype"), choices=tuple(choices), shapes=dict(data.get("shapes") or {}),
                    job=data.get("job"), created=str(data.get("created") or ""), method=dict(data.get("method") or {}),
                    static_step_ms=data.get("static_step_ms"), tuned_step_ms=data.get("tuned_step_ms"),
                    measurements=dict(data.get("measurements") or {}), source=source, origin=origin,
                    explicit=explicit)


def active_lock(arg: LockArg, device: DeviceInfo, *, compile: bool | None = None,
                dtype: str | None = None) -> PlanLock | None:
    """The lock in force for a resolution (see the module's docstring), or None.

    ``arg``: a :class:`PlanLock`, a path (explicit), a :class:`LockFile`, ``None`` (the
    ``VEOMNI_OPS_LOCK`` variable, if set) or ``False`` (none). An explicit lock that is missing
    or does not match raises :class:`LockError` / :class:`LockMismatchError`; a found one is
    ignored with a :class:`LockWarning`."""
    if arg is False:
        return None
    if arg is None:
        env = os.environ.get(ENV_LOCK, "").strip()
        if not env:
            return None
        arg = LockFile(env, explicit=False, origin=ENV_LOCK)
    if isinstance(arg, PlanLock):
        lock = arg
    else:
        ref = arg if isinstance(arg, LockFile) else LockFile(os.fspath(arg))
        if not ref.explicit and not os.path.exists(ref.path):
            warnings.warn(LockWarning(f"plan lock {ref.path} ({ref.origin}) does not exist: auto uses the static "
                                      f"priorities; write it with veomni-ops tune JOB.yaml --out {ref.path}"),
                          stacklevel=3)
            return None
        lock = load_lock(ref.path, explicit=ref.explicit, origin=ref.origin)
    wrong = mismatches(lock, device, compile=compile, dtype=dtype)
    if not wrong:
        return lock
    retune = f"veomni-ops tune {lock.job or 'JOB.yaml'} --out {lock.source}"
    if lock.explicit:
        raise LockMismatchError(
            f"plan lock {lock.source} ({lock.origin}) does not match here: " + "; ".join(wrong)
            + f". Re-tune on this machine ({retune}), or pass no lock (auto then uses the static priorities).",
            wrong)
    warnings.warn(LockWarning(f"ignoring plan lock {lock.source} ({lock.origin}): it does not match here: "
                              + "; ".join(wrong) + f". auto uses the static priorities; re-tune with {retune}"),
                  stacklevel=3)
    return None
