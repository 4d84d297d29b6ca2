"""The results of conformance checks: one case, one kernel, a whole run (with their table
and JSON forms)."""

from __future__ import annotations

import math
import os
import textwrap
import traceback
from dataclasses import dataclass, field
from typing import Any

from .compare import BASELINE_FACTOR, Comparison
from .execution import FAIL, PASS, SKIP, UNSUPPORTED


@dataclass
class CaseResult:
    case: str
    dtype: str
    status: str  # pass | fail | error | unsupported
    worst: float | None = None  # worst error ratio over all compared tensors
    worst_in: str = ""  # which tensor
    max_abs: float | None = None
    message: str = ""
    about: str = ""
    seconds: float = 0.0
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    baseline: float | None = None  # eager-in-dtype error of the worst tensor, when it was needed

    @property
    def ok(self) -> bool:
        return self.status in (PASS, UNSUPPORTED)

    def describe(self) -> str:
        head = f"{self.case} [{self.dtype}]: {self.status}"
        if self.worst is not None:
            head += f", worst error {fmt_ratio(self.worst)} in {self.worst_in} (max |a-b| {self.max_abs:.3g})"
            if self.baseline is not None:
                head += f", eager in {self.dtype}: {fmt_ratio(self.baseline)}"
        if self.message:
            head += f" - {self.message}"
        if self.notes:
            head += " (note: " + "; ".join(self.notes) + ")"
        return head

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "dtype": self.dtype,
            "status": self.status,
            "worst": json_float(self.worst),
            "worst_in": self.worst_in,
            "eager_in_dtype": json_float(self.baseline),
            "max_abs": json_float(self.max_abs),
            "message": self.message,
            "notes": self.notes,
            "seconds": round(self.seconds, 4),
            "tensors": {c.name: {"ratio": json_float(c.ratio), "max_abs": json_float(c.max_abs), "scale": c.scale,
                                 **({"eager_in_dtype": json_float(c.baseline)} if c.baseline is not None else {})}
                        for c in self.comparisons},
        }


#: The text report's width: a line longer is wrapped (at spaces; a word longer than it is kept whole).
WIDTH = 100


def wrapped(line: str, indent: str = "    ") -> list[str]:
    """``line`` as lines of at most :data:`WIDTH` columns, the continuations indented by ``indent``."""
    if len(line) <= WIDTH:
        return [line.rstrip()]
    return textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


def json_float(x: float | None) -> float | str | None:
    if x is None:
        return None
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return float("%.4g" % x)


def fmt_ratio(x: float | None) -> str:
    if x is None:
        return "-"
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return "%.3g" % x


def short_error(e: BaseException, limit: int = 400) -> str:
    msg = f"{type(e).__name__}: {e}".strip()
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def where_raised(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return ""
    f = tb[-1]
    return f" (at {os.path.basename(f.filename)}:{f.lineno} in {f.name})"


@dataclass
class KernelReport:
    op: str
    variant: str
    kernel: str
    distribution: str
    version: str
    status: str  # pass | fail | skip
    reason: str = ""  # why skipped
    device: str = ""
    results: list[CaseResult] = field(default_factory=list)
    #: ``--compile``: "pass", "skip: why" or "FAIL: why" (torch.compile(fullgraph=True) against eager)
    compile: str | None = None
    #: ``--deterministic``: "pass" or "FAIL: what differed between two runs on the same inputs"
    deterministic: str | None = None

    def by_dtype(self) -> dict[str, list[CaseResult]]:
        out: dict[str, list[CaseResult]] = {}
        for r in self.results:
            out.setdefault(r.dtype, []).append(r)
        return out

    def to_dict(self) -> dict[str, Any]:
        worst = [r.worst for r in self.results if r.worst is not None]
        return {
            "op": self.op,
            "variant": self.variant,
            "kernel": self.kernel,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "reason": self.reason,
            "device": self.device,
            "worst": json_float(max(worst)) if worst else None,
            "cases": [r.to_dict() for r in self.results],
            **({"compile": self.compile} if self.compile is not None else {}),
            **({"deterministic": self.deterministic} if self.deterministic is not None else {}),
        }


@dataclass
class CheckReport:
    device: str
    size: str
    seed: int
    kernels: list[KernelReport] = field(default_factory=list)
    load_failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[KernelReport]:
        return [k for k in self.kernels if k.status == FAIL]

    @property
    def checked(self) -> list[KernelReport]:
        return [k for k in self.kernels if k.status != SKIP]

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "size": self.size,
            "seed": self.seed,
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "load_failures": self.load_failures,
            "kernels": [k.to_dict() for k in self.kernels],
        }

    def table(self, verbose: bool = False) -> str:
        """The report in at most :data:`WIDTH` columns: a line per kernel (op/variant, kernel,
        distribution), under it a row per dtype (result, cases, worst error with its tensor
        and case), then the details; a longer line is wrapped, none is cut (``-v`` adds every
        case's line, ``--json`` has every figure)."""
        # in order: per kernel ("kernel", its heading), then ("skip", (reason,)) or a ("dtype", row) per dtype
        rows: list[tuple[str, tuple[str, ...]]] = []
        notes: list[str] = []
        for k in self.kernels:
            rows.append(("kernel", (f"{k.op}/{k.variant}", k.kernel, f"{k.distribution} {k.version}")))
            if k.status == SKIP:
                rows.append(("skip", (k.reason,)))
                continue
            for dtype, results in k.by_dtype().items():
                passed = sum(r.status == PASS for r in results)
                unsup = sum(r.status == UNSUPPORTED for r in results)
                bad = [r for r in results if not r.ok]
                scored = [r for r in results if r.worst is not None]
                worst = max(scored, key=lambda r: r.worst or 0.0) if scored else None
                wtxt = f"{fmt_ratio(worst.worst)} ({worst.worst_in}, {worst.case})" if worst else "-"
                if worst is not None and worst.baseline is not None:
                    wtxt += f"; eager {fmt_ratio(worst.baseline)}"
                cases = f"{passed}/{len(results)}" + (f" ({unsup} unsupported)" if unsup else "")
                rows.append(("dtype", (dtype, "FAIL" if bad else "pass", cases, wtxt)))
                for r in bad:
                    notes.append(f"{k.op}/{k.variant} {k.kernel} {r.describe()}")
                kernel_notes = sorted({n for r in results if r.ok for n in r.notes})
                notes += [f"{k.op}/{k.variant} {k.kernel} [{dtype}] note: {n}" for n in kernel_notes]
                if verbose:
                    notes += [f"{k.op}/{k.variant} {k.kernel} {r.describe()}" for r in results if r.ok]
            if k.compile is not None:
                notes.append(f"{k.op}/{k.variant} {k.kernel} torch.compile(fullgraph=True): {k.compile}")
            if k.deterministic is not None:
                notes.append(f"{k.op}/{k.variant} {k.kernel} bitwise the same on a second run: {k.deterministic}")
        head = ("dtype", "result", "cases", "worst error (tensor, case)")
        widths = [max(len(r[i]) for r in [head, *(r for kind, r in rows if kind == "dtype")])
                  for i in range(len(head) - 1)]
        kernel_head = ("op/variant", "kernel", "from")
        kwidths = [max(len(r[i]) for r in [kernel_head, *(r for kind, r in rows if kind == "kernel")])
                   for i in range(2)]
        lines = [f"veomni-ops check on {self.device}, {self.size} shapes, seed {self.seed}"]
        lines += wrapped(f"worst error: max |a-b| / (atol*s + rtol*|b| + ulp) against float64 eager; pass <= 1, or in "
                         f"bf16/fp16 <= {BASELINE_FACTOR:g}x eager in the same dtype")
        lines.append("  ".join(c.ljust(w) for c, w in zip(kernel_head, kwidths)) + "  " + kernel_head[-1])
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(head, widths)) + "  " + head[-1])
        lines.append("  " + "  ".join("-" * w for w in widths) + "  " + "-" * len(head[-1]))
        hang = " " * (2 + sum(w + 2 for w in widths))  # a wrapped worst error stays in its column
        for kind, row in rows:
            if kind == "kernel":
                lines += wrapped("  ".join(c.ljust(w) for c, w in zip(row, kwidths)) + "  " + row[-1])
            elif kind == "skip":
                lines += wrapped(f"  skip: {row[0]}", indent="    ")
            else:
                lines += wrapped("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1],
                                 indent=hang)
        for f in self.load_failures:
            lines += wrapped(f"load failure: {f}")
        if notes:
            lines.append("details:")
            for n in notes:
                lines += wrapped(f"  {n}", indent="    ")
        n_fail = len(self.failed)
        lines.append(f"{len(self.checked)} kernel(s) checked, {n_fail} failed, "
                     f"{len(self.kernels) - len(self.checked)} skipped, in {self.seconds:.1f} s")
        return "\n".join(lines)
