"""What holds the memory at the peak of one training step, ours beside ``transformers+compile`` (issue 33).

    python benchmarks/gpu/step_memory.py examples/JOB.yaml --out DIR [--json PATH] [--warmup 3] [--timeout 180]

For each run (``ours``: the job as ``veomni-ops train JOB`` runs it; ``transformers+compile``: as
``--baseline transformers+compile`` runs it), in a process of its own so that one allocator's
state never reaches the other: ``veomni_ops.train.loop.train_one`` runs ``--warmup`` steps and one
more, the recorded step, exactly as the CLI does (the loop's own build, bind or patch, compile,
AdamW and step; ``train_one``'s ``before_step`` hook says when the recorded step starts). Until
then the CUDA allocator keeps the stack of every live block (``_record_memory_history("state")``:
the parameters' and the optimizer state's allocation sites); from the recorded step on it keeps
every event too (``"all"``, ``context="alloc"``: a free carries its block's allocation stack).
Four marks split the recorded step (a 4 KB allocation from :func:`_mark_phase`, its size naming
the phase): ``forward`` (the step starts), ``backward`` (``loss.backward()`` is called),
``optimizer`` (AdamW's step begins; the addresses of the parameters, their gradients and AdamW's
state are noted then) and ``end`` (AdamW's step is done). The child writes the allocator's
snapshot (``torch.cuda.memory._snapshot()``, pickled and gzip'd: DIR/NAME.RUN.snapshot.pickle.gz,
which pytorch.org/memory_viz opens) and what it noted (DIR/NAME.RUN.child.json).

:func:`analyze` then reads the snapshot (a pure function of it): the blocks live when the trace
starts (those the snapshot still holds that no event of the trace allocated, and those whose
first event is a free), then every event in order (``alloc`` adds the requested bytes;
``free_requested`` takes them off, as ``torch.cuda.memory_allocated`` does; a ``free_completed``
without one before it too; ``segment_*`` events move the reserved bytes); the peak is the first
event of the recorded step (``forward`` to ``end`` mark) after which the allocated bytes are
highest, and the blocks live then are put in categories (:func:`classify`): parameters, gradients
and optimizer state by address; the fused loss's own buffers by their stacks (frames in
``veomni_triton/kernels/cross_entropy.py`` or ``veomni_ops/ops/cross_entropy/``); what the forward
allocated and still holds -- activations saved for backward -- by the innermost module of the
model in their stacks (attention, MLP, experts, norm, rotary, head, loss, ...; a class is read
from the frame's source file: ``owner_of``), those inside code torch.compile generated as
``activations: compiled (inductor)``; the backward's and the optimizer's temporaries; the step's
batch; compile/inductor buffers from before the step; other. Bytes are the requested sizes the
trace holds (the allocator rounds each block up, to 512 bytes at least: torch's own
``max_memory_allocated``, printed beside, can be slightly higher).

Output: a line per run, a Markdown table (GiB per category, ours and the baseline side by side,
then the 15 largest stacks at each peak; also DIR/NAME.md) and ``--json PATH`` (also DIR/NAME.json).
CUDA only: with ``--device cpu`` or no CUDA device it says so and exits 2; ``--dry-run`` prints
what it would run, anywhere.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import os
import pickle
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

RUNS = ("ours", "transformers+compile")
PHASES = ("forward", "backward", "optimizer", "end")
MARK_BASE = 4093  # a mark's requested size is MARK_BASE + its phase's index (see _mark_phase)
MARK_FN = "_mark_phase"
BLOCK_ACTIONS = ("alloc", "free_requested", "free_completed")
SEGMENT_DELTA = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
LOSS_FILES = ("veomni_triton/kernels/cross_entropy.py", "veomni_ops/ops/cross_entropy/")
COMPILED_FILES = ("torchinductor", "/torch/_inductor/", "/torch/_dynamo/", "/torch/_functorch/")
MODEL_FILES = ("/transformers/", "veomni_ops/ops/", "veomni_ops/binding/", "veomni_triton/", "veomni_liger/",
               "liger_kernel/")
BUILD_FNS = ("build_model", "reference_model", "init_from_reference", "materialize", "_prepare", "_bind")
#: (kind, pattern) in order: the first that matches a frame's text (its owner and function, or the
#: path below a veomni package) names the module. Order matters: "Qwen3MoeRMSNorm" is a norm.
MODULE_KINDS = (
    ("loss", r"loss|cross_entropy"),
    ("head (logits)", r"forcausallm|lm_head|functions/head"),
    ("attention", r"attention|attn|sdpa|flash"),
    ("rotary", r"rotary|rope"),
    ("norm", r"norm"),
    ("mlp", r"mlp|swiglu"),
    ("experts", r"expert|sparsemoe|moeblock|grouped_mm|moe_"),
    ("embedding", r"embed"),
    ("decoder layer", r"decoderlayer"),
    ("model body", r"model\.forward"),
)
GIB = 2**30


# ---------------------------------------------------------------------------------------------
# the snapshot: pure functions of its dict


def mark_of(event: dict[str, Any]) -> str | None:
    """The phase an ``alloc`` event marks (:func:`_mark_phase`), or None for any other event."""
    if event.get("action") != "alloc":
        return None
    k = int(event.get("size", -1)) - MARK_BASE
    if 0 <= k < len(PHASES) and any(f.get("name") == MARK_FN for f in event.get("frames") or ()):
        return PHASES[k]
    return None


def _initial(snapshot: dict[str, Any], trace: list[dict[str, Any]], device: int) -> dict[int, dict[str, Any]]:
    """The blocks allocated when the trace starts: each address whose first event frees it, and
    each block the snapshot holds allocated that no event of the trace touches."""
    first: dict[int, dict[str, Any]] = {}
    for e in trace:
        if e.get("action") in BLOCK_ACTIONS:
            first.setdefault(int(e["addr"]), e)
    live = {a: {"addr": a, "size": int(e["size"]), "frames": e.get("frames") or [], "phase": "before", "index": -1}
            for a, e in first.items() if e["action"] == "free_requested"}
    for seg in snapshot.get("segments", []):
        if int(seg.get("device", device)) != device:
            continue
        for b in seg.get("blocks", []):
            a = int(b["address"])
            if b.get("state") == "active_allocated" and a not in first:
                live[a] = {"addr": a, "size": int(b.get("requested_size", b["size"])), "frames": b.get("frames") or [],
                           "phase": "before", "index": -1}
    return live


def _walk(snapshot: dict[str, Any], trace: list[dict[str, Any]], device: int, marks: dict[str, int], reserved: int,
          window: tuple[int, int], stop: int) -> tuple[dict[int, dict[str, Any]], int, int, int, int]:
    """The trace replayed up to event ``stop``: (the blocks live then, the allocated bytes at the
    start, the peak within ``window`` (first and last event index), its index, the reserved bytes then)."""
    lo, hi = window
    live = _initial(snapshot, trace, device)
    total = start = sum(b["size"] for b in live.values())
    res = reserved
    peak, peak_i, peak_res = (total, -1, res) if lo == 0 else (-1, -1, res)
    phase = "before" if marks else "step"
    skip: set[int] = set()
    for i, e in enumerate(trace[:stop + 1]):
        act = e.get("action")
        if (m := mark_of(e)) is not None:
            phase = m
            skip.add(int(e["addr"]))
        elif act == "alloc":
            a = int(e["addr"])
            skip.discard(a)
            live[a] = {"addr": a, "size": int(e["size"]), "frames": e.get("frames") or [], "phase": phase, "index": i}
            total += int(e["size"])
        elif act in ("free_requested", "free_completed"):
            a = int(e["addr"])
            if a in skip:  # a mark's own free
                if act == "free_completed":
                    skip.discard(a)
            elif a in live:
                total -= live.pop(a)["size"]
        else:
            res += SEGMENT_DELTA.get(str(act), 0) * int(e.get("size", 0))
        if lo <= i <= hi and total > peak:
            peak, peak_i, peak_res = total, i, res
    return live, start, peak, peak_i, peak_res


def replay(snapshot: dict[str, Any], device: int = 0) -> dict[str, Any]:
    """Replay the trace of ``device``: the marks (phase -> event index), the allocated and reserved
    bytes when it starts and at its peak, the peak's event index (-1: before any event) and the
    blocks live then (each: addr, size, frames, phase of its allocation, its alloc event's index,
    ``at_optimizer``: still allocated at the ``optimizer`` mark, None without that mark)."""
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    marks: dict[str, int] = {}
    for i, e in enumerate(trace):
        if (m := mark_of(e)) is not None:
            marks.setdefault(m, i)
    lo = marks.get("forward", 0)
    hi = marks.get("end", len(trace) - 1)
    segments = [s for s in snapshot.get("segments", []) if int(s.get("device", device)) == device]
    reserved = sum(int(s["total_size"]) for s in segments) - sum(
        SEGMENT_DELTA.get(e.get("action", ""), 0) * int(e.get("size", 0)) for e in trace)

    def run(stop: int) -> tuple[dict[int, dict[str, Any]], int, int, int, int]:
        return _walk(snapshot, trace, device, marks, reserved, (lo, hi), stop)

    _, start, peak, peak_i, peak_res = run(len(trace) - 1)
    live, *_ = run(peak_i)
    blocks = sorted(live.values(), key=lambda b: (-b["size"], b["addr"]))
    opt = marks.get("optimizer")
    if opt is not None:
        later, *_ = run(max(opt, peak_i))
        for b in blocks:  # the same allocation: the block at its address then came from the same event
            b["at_optimizer"] = b["addr"] in later and later[b["addr"]]["index"] == b["index"]
    else:
        for b in blocks:
            b["at_optimizer"] = None
    return {"events": len(trace), "marks": marks, "start_bytes": start, "peak_bytes": peak, "peak_index": peak_i,
            "reserved_at_peak": peak_res, "reserved_at_start": reserved, "live": blocks}


def module_kind(frames: list[dict[str, Any]], owner_of: Callable[[str, int], str | None] | None = None) -> str | None:
    """The kind of the innermost module of the model in ``frames`` (innermost first, as the
    allocator gives them), by :data:`MODULE_KINDS`; None where no frame is the model's code."""
    for f in frames:
        # FX's original trace (torch.compile's graphs, where the snapshot was augmented): its innermost frame
        fx = str(f.get("fx_original_trace") or "").strip().splitlines()[-2:]
        text = re.sub(r'File "[^"]*"', "", " ".join(fx))
        name = str(f.get("filename", ""))
        if any(p in name for p in MODEL_FILES):
            owner = owner_of(name, int(f.get("line", 0))) if owner_of else None
            tail = re.split(r"veomni_ops/|veomni_triton/|veomni_liger/|liger_kernel/", name)[-1] \
                if "/transformers/" not in name else ""
            text += f" {owner or ''} {f.get('name', '')} {tail}"
        if not text.strip():
            continue
        low = text.lower()
        for kind, pattern in MODULE_KINDS:
            if re.search(pattern, low):
                return kind
    return None


def _before_step(files: list[str], names: list[str]) -> str:
    """The category of a block allocated before the recorded step (and not known by address)."""
    if any("veomni_ops/train/data.py" in fn for fn in files):
        return "inputs (the step's batch)"
    if any(p in fn for fn in files for p in COMPILED_FILES):
        return "compile/inductor"
    if any(n in BUILD_FNS for n in names):
        return "parameters"  # the model's buffers (rotary tables, ...); its parameters are known by address
    return "other (before the step)"


def classify(block: dict[str, Any], known: dict[str, Iterable[int]] | None = None,
             owner_of: Callable[[str, int], str | None] | None = None) -> str:
    """The category of a block live at the peak (:func:`replay`'s ``live``). ``known``: the
    addresses noted at the optimizer mark (``parameters``, ``gradients``, ``optimizer state``); a
    block counts as one of them where it was still allocated then."""
    if block.get("at_optimizer") is not False:
        for name in ("parameters", "gradients", "optimizer state"):
            addrs = (known or {}).get(name, ())
            if block["addr"] in (addrs if isinstance(addrs, (set, frozenset)) else set(addrs)):
                return name
    files = [str(f.get("filename", "")) for f in block["frames"]]
    phase = block["phase"]
    if any(p in fn for fn in files for p in LOSS_FILES):
        return "fused loss buffers"
    if any("/torch/optim/" in fn for fn in files):
        return "optimizer state" if phase == "before" else "optimizer temporaries"
    if phase == "before":
        return _before_step(files, [str(f.get("name", "")) for f in block["frames"]])
    if phase == "backward":
        return "backward temporaries"
    if phase in ("optimizer", "end"):
        return "optimizer temporaries"
    kind = module_kind(block["frames"], owner_of)
    if any(p in fn for fn in files for p in COMPILED_FILES):
        return "activations: compiled (inductor)" if kind is None else f"activations: compiled, in {kind}"
    return f"activations: {kind}" if kind else "activations: other"


def _frame_text(f: dict[str, Any], owner_of: Callable[[str, int], str | None] | None) -> str:
    name = str(f.get("filename", ""))
    short = "/".join(name.split("/")[-2:])
    owner = owner_of(name, int(f.get("line", 0))) if owner_of and any(p in name for p in MODEL_FILES) else None
    return f"{short}:{f.get('line', 0)} {owner or f.get('name', '')}"


def stack_key(frames: list[dict[str, Any]], owner_of: Callable[[str, int], str | None] | None = None,
              depth: int = 6) -> str:
    """A block's stack in one line: its innermost ``depth`` frames outside torch's own Python
    (the code generated by torch.compile kept), innermost first."""
    ours = [f for f in frames if "/torch/" not in str(f.get("filename", "")) or "torchinductor" in
            str(f.get("filename", ""))]
    if not ours:
        return "(torch internals only)" if frames else "(no Python frames: the autograd engine or C++)"
    return " < ".join(_frame_text(f, owner_of) for f in ours[:depth])


def analyze(snapshot: dict[str, Any], device: int = 0, known: dict[str, Iterable[int]] | None = None,
            owner_of: Callable[[str, int], str | None] | None = None, top: int = 15) -> dict[str, Any]:
    """:func:`replay`, then every block live at the peak in its category (:func:`classify`):
    bytes per category, per phase, and the ``top`` stacks by bytes. Pure: reads only its arguments
    (``owner_of``: a frame's class, where the caller can read sources)."""
    r = replay(snapshot, device)
    known = {k: set(v) for k, v in (known or {}).items()}
    cats: dict[str, int] = defaultdict(int)
    phases: dict[str, int] = defaultdict(int)
    stacks: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for b in r["live"]:
        c = b["category"] = classify(b, known, owner_of)
        cats[c] += b["size"]
        phases[b["phase"]] += b["size"]
        s = stacks[(c, stack_key(b["frames"], owner_of))]
        s[0] += b["size"]
        s[1] += 1
    ranked = sorted(stacks.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "events": r["events"], "marks": r["marks"], "peak_index": r["peak_index"], "peak_bytes": r["peak_bytes"],
        "start_bytes": r["start_bytes"], "reserved_at_peak": r["reserved_at_peak"],
        "peak_event": _event_note(snapshot, device, r["peak_index"]),
        "categories": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
        "phases": dict(sorted(phases.items(), key=lambda kv: -kv[1])),
        "live_blocks": len(r["live"]),
        "top_stacks": [{"category": c, "stack": s, "bytes": v[0], "blocks": v[1]} for (c, s), v in ranked],
    }


def _event_note(snapshot: dict[str, Any], device: int, index: int) -> str | None:
    if index < 0:
        return None
    e = snapshot["device_traces"][device][index]
    return f"{e.get('action')} of {int(e.get('size', 0)) / 2**20:.1f} MiB at {stack_key(e.get('frames') or [])}"


# ---------------------------------------------------------------------------------------------
# reading sources: the class a frame's line is in


class SourceOwners:
    """``owner_of(filename, line)``: ``Class.function`` (or ``function``) the line is in, read
    from the file with :mod:`ast` (each file once); None where the file cannot be read."""

    def __init__(self) -> None:
        self._spans: dict[str, list[tuple[int, int, str]] | None] = {}

    def _read(self, filename: str) -> list[tuple[int, int, str]] | None:
        try:
            with open(filename, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
        except (OSError, SyntaxError, ValueError):
            return None
        spans: list[tuple[int, int, str]] = []

        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        spans.append((child.lineno, child.end_lineno or child.lineno, name))
                    walk(child, name + ".")
        walk(tree, "")
        return spans

    def __call__(self, filename: str, line: int) -> str | None:
        if filename not in self._spans:
            self._spans[filename] = self._read(filename)
        spans = self._spans[filename]
        inside = [s for s in spans or () if s[0] <= line <= s[1]]
        return max(inside, key=lambda s: s[0])[2] if inside else None


# ---------------------------------------------------------------------------------------------
# the child: one run, recorded


def _mark_phase(torch, device: str, phase: str) -> None:
    """A mark in the allocator's trace: a short-lived allocation whose size names ``phase``."""
    t = torch.empty(MARK_BASE + PHASES.index(phase), dtype=torch.uint8, device=device)
    del t


def _storage(t) -> int | None:
    t = getattr(t, "_local_tensor", t)
    return int(t.untyped_storage().data_ptr()) if getattr(t, "is_cuda", False) else None


def child(a: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("step_memory: no CUDA device here: the allocator's history is CUDA's", file=sys.stderr)
        return 2
    from veomni_ops.train.job import load_job
    from veomni_ops.train.loop import train_one

    job = load_job(a.config)
    job["train"]["steps"] = a.warmup + 1
    device = f"cuda:{torch.cuda.current_device()}"
    recorded = a.warmup + 1
    note: dict[str, Any] = {"run": a.child, "config": a.config, "device_index": torch.cuda.current_device(),
                            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "warmup": a.warmup,
                            "recorded_step": recorded, "stacks": a.stacks, "known": {}}
    state = {"on": False}

    def before_step(n: int) -> None:
        if n != recorded:
            return
        torch.cuda.synchronize()
        note["warmup_max_allocated"] = torch.cuda.max_memory_allocated()
        note["warmup_max_reserved"] = torch.cuda.max_memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        kw = {"context": "alloc", "stacks": a.stacks, "max_entries": a.max_entries}
        try:
            torch.cuda.memory._record_memory_history("all", clear_history=True, **kw)
        except TypeError:  # a torch without clear_history: the replay starts wherever the trace does
            torch.cuda.memory._record_memory_history("all", **kw)
        state["on"] = True
        _mark_phase(torch, device, "forward")

    backward = torch.Tensor.backward

    def marked_backward(self, *args, **kwargs):
        if state["on"]:
            _mark_phase(torch, device, "backward")
        return backward(self, *args, **kwargs)

    def opt_pre(opt, args, kwargs) -> None:
        if not state["on"]:
            return
        _mark_phase(torch, device, "optimizer")
        params = [p for g in opt.param_groups for p in g["params"]]
        note["known"] = {
            "parameters": [x for p in params if (x := _storage(p)) is not None],
            "gradients": [x for p in params if p.grad is not None and (x := _storage(p.grad)) is not None],
            "optimizer state": [x for p in params for v in opt.state.get(p, {}).values()
                                if isinstance(v, torch.Tensor) and (x := _storage(v)) is not None],
        }

    def opt_post(opt, args, kwargs) -> None:
        if state["on"]:
            _mark_phase(torch, device, "end")
            state["on"] = False

    torch.Tensor.backward = marked_backward  # type: ignore[method-assign]
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(opt_pre)
    register_optimizer_step_post_hook(opt_post)
    torch.cuda.memory._record_memory_history("state", context="state", stacks=a.stacks)
    baseline = None if a.child == "ours" else a.child
    t0 = time.time()
    res = train_one(job, out=sys.stderr, baseline=baseline, before_step=before_step)
    torch.cuda.synchronize()
    note["step_max_allocated"] = torch.cuda.max_memory_allocated()
    note["step_max_reserved"] = torch.cuda.max_memory_reserved()
    note["losses"] = res.get("losses")
    note["run_peak_gib"] = res.get("peak_gib")
    try:
        snap = torch.cuda.memory._snapshot(augment_with_fx_traces=True)
    except TypeError:  # a torch without FX augmentation
        snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    base = os.path.join(a.out, f"{a.name}.{_slug(a.child)}")
    with gzip.open(base + ".snapshot.pickle.gz", "wb", compresslevel=6) as fh:
        pickle.dump(snap, fh)
    note["seconds"] = round(time.time() - t0, 1)
    with open(base + ".child.json", "w") as fh:
        json.dump(note, fh)
    return 0


def _slug(run: str) -> str:
    return run.replace("+", "-")


# ---------------------------------------------------------------------------------------------
# the parent: a child per run, then the analysis and the tables


def _child_cmd(a: argparse.Namespace, run: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), a.config, "--child", run, "--out", a.out, "--name", a.name,
            "--warmup", str(a.warmup), "--max-entries", str(a.max_entries), "--stacks", a.stacks]


def run_one(a: argparse.Namespace, run: str) -> dict[str, Any]:
    base = os.path.join(a.out, f"{a.name}.{_slug(run)}")
    t0 = time.time()
    with open(base + ".log", "w") as log:
        try:
            rc = subprocess.run(_child_cmd(a, run), stdout=log, stderr=subprocess.STDOUT, timeout=a.timeout).returncode
        except subprocess.TimeoutExpired:
            return {"run": run, "error": f"timed out after {a.timeout} s (see {base}.log)"}
    if rc != 0:
        with open(base + ".log") as fh:
            tail = fh.read().strip().splitlines()[-3:]
        return {"run": run, "error": f"exit {rc}: " + " | ".join(tail)}
    with open(base + ".child.json") as fh:
        note = json.load(fh)
    with gzip.open(base + ".snapshot.pickle.gz", "rb") as fh:
        snap = pickle.load(fh)
    res = analyze(snap, note["device_index"], note["known"], SourceOwners(), top=15)
    res.update({k: note.get(k) for k in ("run", "gpu", "torch", "warmup", "recorded_step", "warmup_max_allocated",
                                          "warmup_max_reserved", "step_max_allocated", "step_max_reserved", "losses")})
    res["snapshot"] = base + ".snapshot.pickle.gz"
    res["seconds"] = round(time.time() - t0, 1)
    return res


def _g(x: Any) -> str:
    return f"{x / GIB:.2f}" if isinstance(x, (int, float)) else "-"


def markdown(name: str, results: list[dict[str, Any]]) -> str:
    ok = [r for r in results if "error" not in r]
    lines = [f"## {name}: what is allocated at the recorded step's peak (GiB)", ""]
    for r in results:
        if "error" in r:
            lines.append(f"- {r['run']}: failed: {r['error']}")
    if not ok:
        return "\n".join(lines) + "\n"
    head = "| category | " + " | ".join(r["run"] for r in ok) + (" | ours - baseline |" if len(ok) == 2 else " |")
    lines += [head, "|---" * (len(ok) + 1 + (len(ok) == 2)) + "|"]
    cats = sorted({c for r in ok for c in r["categories"]}, key=lambda c: -max(r["categories"].get(c, 0) for r in ok))
    rows = [("**peak (trace, requested bytes)**", [r["peak_bytes"] for r in ok])]
    rows += [(c, [r["categories"].get(c, 0) for r in ok]) for c in cats]
    rows += [("max_memory_allocated (the recorded step)", [r["step_max_allocated"] for r in ok]),
             ("max_memory_reserved (the recorded step)", [r["step_max_reserved"] for r in ok]),
             ("max_memory_allocated (the warm-up steps)", [r["warmup_max_allocated"] for r in ok]),
             ("reserved at the peak (trace)", [r["reserved_at_peak"] for r in ok])]
    for label, vals in rows:
        diff = f" | {(vals[0] - vals[1]) / GIB:+.2f}" if len(ok) == 2 and all(isinstance(v, int) for v in vals) else (
            " | -" if len(ok) == 2 else "")
        lines.append(f"| {label} | " + " | ".join(_g(v) for v in vals) + diff + " |")
    for r in ok:
        lines += ["", f"### {r['run']}: the {len(r['top_stacks'])} largest stacks at the peak "
                      f"(event {r['peak_index']} of {r['events']}: {r['peak_event']})", "",
                  "| GiB | blocks | category | stack (innermost first) |", "|---|---|---|---|"]
        for s in r["top_stacks"]:
            lines.append(f"| {s['bytes'] / GIB:.3f} | {s['blocks']} | {s['category']} | "
                         f"{s['stack'].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("config", help="a job YAML (examples/...)")
    ap.add_argument("--out", default="step-memory", help="folder for the snapshots, logs, JSON and Markdown")
    ap.add_argument("--name", help="file name stem (default: the YAML's)")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON here too")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)} (default both)")
    ap.add_argument("--warmup", type=int, default=3, help="steps before the recorded one (default 3)")
    ap.add_argument("--timeout", type=int, default=180, help="seconds a run may take (default 180)")
    ap.add_argument("--max-entries", type=int, default=1_000_000, help="the allocator's trace ring (default 1e6)")
    ap.add_argument("--stacks", choices=("python", "all"), default="python",
                    help="python frames only (default), or C++ frames too (slow to symbolize)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dry-run", action="store_true", help="print what would run, and run nothing")
    ap.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.name = a.name or os.path.splitext(os.path.basename(a.config))[0]
    runs = [r.strip() for r in a.runs.split(",") if r.strip()]
    bad = [r for r in runs if r not in RUNS]
    if bad or a.warmup < 1:
        ap.error(f"--runs: unknown {bad}; know {list(RUNS)}" if bad else "--warmup: at least 1")
    if a.child:
        return child(a)
    if a.dry_run:
        for r in runs:
            print(f"{r}: {' '.join(_child_cmd(a, r))}  (timeout {a.timeout} s; {a.warmup} warm-up step(s), then step "
                  f"{a.warmup + 1} recorded)")
        print(f"then: {a.out}/{a.name}.md and {a.out}/{a.name}.json" + (f", and {a.json}" if a.json else ""))
        return 0
    if a.device == "cpu":
        print("step_memory: --device cpu: the allocator's history is CUDA's; run it on a GPU (--dry-run shows the plan)")
        return 2
    import torch

    if not torch.cuda.is_available():
        print("step_memory: no CUDA device here: the allocator's history is CUDA's; run it on a GPU (--dry-run shows "
              "the plan)")
        return 2
    os.makedirs(a.out, exist_ok=True)
    results = []
    for r in runs:
        res = run_one(a, r)
        results.append(res)
        if "error" in res:
            print(f"{a.name} {r}: FAILED: {res['error']}", flush=True)
        else:
            print(f"{a.name} {r}: peak {_g(res['peak_bytes'])} GiB at event {res['peak_index']}/{res['events']}; "
                  f"max_memory_allocated {_g(res['step_max_allocated'])} GiB, reserved "
                  f"{_g(res['step_max_reserved'])} GiB (recorded step); warm-up max allocated "
                  f"{_g(res['warmup_max_allocated'])} GiB, reserved {_g(res['warmup_max_reserved'])} GiB "
                  f"({res['seconds']} s)", flush=True)
    md = markdown(a.name, results)
    print(md)
    with open(os.path.join(a.out, f"{a.name}.md"), "w") as fh:
        fh.write(md)
    for path in filter(None, [os.path.join(a.out, f"{a.name}.json"), a.json]):
        with open(path, "w") as fh:
            json.dump({"config": a.config, "runs": results}, fh, indent=1)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
