"""What ``veomni-ops tune`` times for a job: per op request the model makes, the candidate
kernels usable here (in the job's mode and dtype, honouring what the model's places need), the
static ``auto`` choice among them, and the trials that time them."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from ..config import AUTO, OP_TO_FIELD
from ..device import DeviceInfo, current_device, is_local, parse_device
from ..lock import KernelNames, LockChoice, PlanLock, device_fingerprint, now, versions_here
from ..plan import KernelPlan
from ..registry import RegisteredKernel, Registry
from ..resolve import OpRequest, load_kernel
from ..spec import OPS
from ..target import Mode, Target
from ..train.job import TrainConfigError

#: The config fields of a model that make its shapes (recorded in the lock, where the config has them).
SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "num_local_experts", "n_routed_experts")


@dataclass(frozen=True)
class Candidate(KernelNames):
    """One kernel that can serve a request here: its name, distribution and the variant it provides."""

    kernel: str
    distribution: str
    variant: str

    @classmethod
    def of(cls, rk: RegisteredKernel) -> Candidate:
        return cls(rk.spec.name, rk.provenance.distribution, rk.spec.variant)


@dataclass(frozen=True)
class Request:
    """One request of an op the model makes (its variants, preferred first), left on ``auto``:
    the candidates usable here, the static ``auto`` choice, and what was passed over and why."""

    op: str
    variants: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    static: Candidate | None
    passed: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.op}/{'|'.join(self.variants)}"

    def key(self, c: Candidate) -> str:
        """The key of the measurement of ``c`` for this request (in the lock and the side file)."""
        return f"{self.label}:{c.full_name}"

    @property
    def timed(self) -> bool:
        """Two or more candidates: each is timed (one alone is taken without timing)."""
        return len(self.candidates) > 1


@dataclass(frozen=True)
class Trial:
    """One timed run: a key, the lock it binds the job with (``False``: the static plan), and the
    request and candidate it times (None for the static and the tuned plan)."""

    key: str
    lock: PlanLock | bool
    request: Request | None = None
    candidate: Candidate | None = None

    @property
    def label(self) -> str:
        if self.request is None or self.candidate is None:
            return {"static": "static auto (every op at its static choice)",
                    "static-again": "static auto again (after the candidates: the machine's drift)",
                    "tuned": "tuned plan (every op at the lock's choice)"}.get(self.key, self.key)
        return f"{self.request.label}: {self.candidate.full_name}"


@dataclass(frozen=True)
class TuneSetup:
    """Everything ``tune`` needs to know about a job before it times anything."""

    job: dict[str, Any]
    device: DeviceInfo
    compile: bool
    dtype: str
    shapes: dict[str, Any]
    requests: tuple[Request, ...]
    named: tuple[tuple[str, str], ...]
    static_plan: KernelPlan

    @property
    def mode(self) -> str:
        return "compile" if self.compile else "eager"

    @property
    def plugins(self) -> list[str]:
        """Every distribution whose kernel is a candidate (their versions are recorded and matched)."""
        return sorted({c.distribution for r in self.requests for c in r.candidates})

    def lock(self, choices: Iterable[LockChoice], **fields: Any) -> PlanLock:
        """A lock of this job's environment with ``choices`` (the others: ``fields``)."""
        base: dict[str, Any] = dict(device=device_fingerprint(self.device), versions=versions_here(self.plugins),
                                    mode=self.mode, dtype=self.dtype, choices=tuple(choices), shapes=self.shapes,
                                    job=self.job["path"], created=now(), source="veomni-ops tune", origin="tune")
        return PlanLock(**{**base, **fields})

    def trial(self, request: Request, c: Candidate) -> Trial:
        """The trial that binds ``c`` for ``request`` and every other op at its static choice."""
        choice = LockChoice(request.op, request.variants, c.variant, c.kernel, c.distribution,
                            f"the candidate veomni-ops tune is timing ({request.key(c)})")
        return Trial(request.key(c), self.lock([choice], source=f"tune trial {request.key(c)}"), request, c)

    def trials(self) -> list[Trial]:
        """The static plan first, then each candidate of each timed request that is not its static choice."""
        out = [Trial("static", False)]
        for r in self.requests:
            if r.timed:
                out += [self.trial(r, c) for c in r.candidates if c != r.static]
        return out

    def fingerprint(self) -> dict[str, Any]:
        """What measurements depend on: a side file made under another fingerprint is not resumed."""
        return {"job": self.job["path"], "device": device_fingerprint(self.device),
                "versions": versions_here(self.plugins), "mode": self.mode, "dtype": self.dtype,
                "shapes": self.shapes, "ops": self.job["ops"].to_dict(),
                "trials": [t.key for t in self.trials()]}


def tune_device(job: dict[str, Any]) -> tuple[str, DeviceInfo]:
    """Where the job trains (torch's device string) and the device its plan is resolved for."""
    from ..train.job import plan_device
    from ..train.model import resolve_device

    where = resolve_device(job["train"]["device"])
    dev = current_device(plan_device(where))
    wants = parse_device(where.split(":")[0]).type
    if dev.type != wants and not dev.from_env and wants != "cpu":
        # A job for a GPU read on a machine without one: plan for the job's device (a GPU of unknown
        # capability), not this machine's CPU, so that a dry run shows the plan the job would get
        # there and a real tune refuses to time it here (it was timing the CPU's plan).
        dev = replace(parse_device(wants), name=f"the job's train.device {job['train']['device']}")
    return where, dev


def check_tunable(job: dict[str, Any]) -> None:
    """Refuse what ``tune`` cannot time: a parallel layout (it times one process)."""
    from ..train.loop import is_parallel

    if is_parallel(job):
        raise TrainConfigError(f"{job['path']}: veomni-ops tune times one process, and this job has a parallel layout "
                               "(or runs under torchrun); tune a copy of the job without its parallel: section, with "
                               "the per-rank batch, and without torchrun")


def setup(job: dict[str, Any], registry: Registry | None = None) -> TuneSetup:
    """The candidates of every op the job's model needs and its config leaves on ``auto``. The
    model is built on the meta device (no memory, no weights): only its places are read."""
    import torch

    from ..binding import apply, model_needs
    from ..discovery import discover
    from ..train.model import build_config, build_model

    check_tunable(job)
    reg = registry if registry is not None else discover()
    _, dev = tune_device(job)
    compile = bool(job["train"]["compile"])
    dtype = str(getattr(torch, job["train"]["dtype"])).removeprefix("torch.")
    model = build_model(job, "meta").to(dtype=getattr(torch, dtype))
    cfg = job["ops"]
    needs, features = model_needs(model, cfg)  # before binding: a bound place is no longer the library's
    target = Target(dev, dtype=dtype, mode=Mode.of(compile=compile), needs=needs, features=features)
    static = (apply(model, cfg, device=dev, registry=reg, compile=compile, lock=False).plan if is_local(dev) else
              _remote_plan(cfg, target, reg))
    requests = []
    for op in OPS:
        if cfg.for_op(op) != AUTO:
            continue
        for need in (target.needs or {}).get(op, ()):
            # Planning for another device (VEOMNI_OPS_DEVICE, for --dry-run): no import, and this
            # machine's installed packages say nothing about that one's (as `veomni-ops resolve --device`).
            req = OpRequest(op, need, AUTO, target, load=is_local(dev), check_requires=is_local(dev))
            requests.append(_request(reg, req, static))
    named = tuple((OP_TO_FIELD[op], cfg.for_op(op)) for op in OPS if cfg.for_op(op) != AUTO)
    return TuneSetup(job, dev, compile, dtype, _shapes(job, build_config(job)), tuple(requests), named, static)


def _remote_plan(cfg: Any, target: Target, reg: Registry) -> KernelPlan:
    """The static plan for another device (no kernel imported, its requirements not checked here)."""
    from ..resolve import resolve

    return resolve(cfg, target, registry=reg, load=False, check_requires=False, lock=False)


def _request(reg: Registry, req: OpRequest, static: KernelPlan) -> Request:
    """The candidates of one request: every registered kernel of its variants usable here (its
    kernel imported, on this machine's device), in the static ``auto`` order's variants."""
    cands: list[Candidate] = []
    passed: list[str] = []
    for v in req.variants:
        for rk in reg.for_op(req.op, v):
            problem = req.problem(rk.spec)
            if problem is None and req.load:
                try:
                    load_kernel(rk)
                except Exception as e:
                    passed.append(f"{reg.name_of(rk)} (its kernel failed to import: {type(e).__name__}: {e})")
                    continue
            if problem is not None:
                passed.append(f"{reg.name_of(rk)}/{v} ({problem})")
                continue
            cands.append(Candidate.of(rk))
    chosen = [entry for v in req.variants if (entry := static.get(req.op, v)) is not None]
    static_choice = Candidate.of(chosen[0].registered) if chosen else None
    return Request(req.op, req.variants, tuple(cands), static_choice, tuple(passed))


def _shapes(job: dict[str, Any], config: Any) -> dict[str, Any]:
    t = job["train"]
    out: dict[str, Any] = {"model_type": getattr(config, "model_type", job.get("architecture")),
                           "batch_size": int(t["batch_size"]), "seq_len": int(t["seq_len"]),
                           "tokens_per_step": int(t["batch_size"]) * int(t["seq_len"])}
    for f in SHAPE_FIELDS:
        v = getattr(config, f, None)
        if isinstance(v, int) and not isinstance(v, bool):
            out[f] = v
    return out


def default_out(job: dict[str, Any]) -> str:
    """Where ``tune`` writes the lock of ``job`` by default: its ``lock:`` key, else ``JOB.lock.json``
    beside the YAML."""
    ref = job.get("lock")
    if ref is not None and hasattr(ref, "path"):
        return str(ref.path)
    stem, _ = os.path.splitext(job["path"])
    return stem + ".lock.json"
