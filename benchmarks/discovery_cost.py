"""What plugin discovery costs at start-up, in fresh processes.

Measures, each as the median over N fresh interpreter processes:

(a) ``python -c "import torch"``                                   the floor every job pays
(b) ``python -c "import torch, veomni_ops; veomni_ops.discover()"`` the same plus discovering
                                                                    every installed plugin
(c) ``python -c "import veomni_ops; veomni_ops.discover()"``        discovery alone (shows whether
                                                                    the core or a plugin pulls torch in)

and reports (b) - (a), the start-up cost of veomni-ops, against the goal of <= 100 ms, as
wall time and as the child's CPU time (user + sys; steadier than wall time on a busy
machine). The runs of (a), (b) and (c) are interleaved so that drift (page cache, other
load) hits them alike; each command runs ``--warmup`` times first, unmeasured. It also
records what discovery loaded (one extra process), the registry's own
``discovery_seconds``, and the in-process cost of ``import veomni_ops`` + ``discover()`` in a
process that has already imported torch (median of a few processes; no start-up noise).

Run it with the interpreter of the environment to measure (all plugins installed there)::

    /path/to/venv/bin/python benchmarks/discovery_cost.py --runs 20 --json discovery_cost.json

``tests/packaging`` runs it in the fresh test venv and prints the result (no assertion on time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

GOAL_MS = 100.0

SNIPPETS = {
    "import_torch": "import torch",
    "import_torch_and_discover": "import torch, veomni_ops; veomni_ops.discover()",
    "discover_only": "import veomni_ops; veomni_ops.discover()",
}

PROBE = """
import json, sys, time
t0 = time.perf_counter()
import veomni_ops
t1 = time.perf_counter()
reg = veomni_ops.discover()
t2 = time.perf_counter()
print(json.dumps({
    "import_veomni_ops_ms": (t1 - t0) * 1e3,
    "discover_ms": (t2 - t1) * 1e3,
    "registry_discovery_ms": reg.discovery_seconds * 1e3,
    "torch_imported_by_discovery": "torch" in sys.modules,
    "plugins_loaded": sorted(f"{p.provenance.distribution} {p.provenance.version} ({p.provenance.entry_point})"
                             for p in reg.plugins if p.status == "loaded"),
    "plugins_failed": sorted(f"{p.provenance.distribution} ({p.provenance.entry_point}): {p.reason}"
                             for p in reg.plugins if p.status == "failed"),
    "plugins_disabled": sorted(p.provenance.entry_point for p in reg.plugins if p.status == "disabled"),
    "kernels": len(reg),
    "veomni_ops_file": veomni_ops.__file__,
}))
"""


def _time_once(python: str, code: str, env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + sys of the child) of one fresh process, in ms.

    CPU time is what the process itself spent; unlike wall time it barely moves when other
    work shares the machine, so it is the figure to trust on a busy host."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([python, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    _, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    # communicate() has reaped the child; its usage is in RUSAGE_CHILDREN, so take the delta.
    if proc.returncode != 0:
        raise SystemExit(f"`{python} -c {code!r}` failed ({proc.returncode}):\n{stderr[-2000:]}")
    return wall * 1e3, _child_cpu_ms()


_last_children_cpu = 0.0


def _child_cpu_ms() -> float:
    global _last_children_cpu
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = (ru.ru_utime + ru.ru_stime) * 1e3
    delta, _last_children_cpu = total - _last_children_cpu, total
    return delta


def _probe(python: str, code: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"probe failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(python: str, runs: int, warmup: int, env: dict[str, str]) -> dict[str, Any]:
    wall: dict[str, list[float]] = {k: [] for k in SNIPPETS}
    cpu: dict[str, list[float]] = {k: [] for k in SNIPPETS}
    _child_cpu_ms()  # start the delta from here
    for _ in range(warmup):
        for code in SNIPPETS.values():
            _time_once(python, code, env)
    for _ in range(runs):
        for key, code in SNIPPETS.items():
            w, c = _time_once(python, code, env)
            wall[key].append(w)
            cpu[key].append(c)
    med = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    info = _probe(python, PROBE, env)
    # The increment measured inside one process that already imported torch: no process
    # start-up noise, so it is the sharper figure for "what does veomni-ops add".
    after = [_probe(python, "import torch\n" + PROBE, env) for _ in range(max(3, min(runs, 10)))]
    info["after_torch_import_veomni_ops_ms"] = statistics.median(a["import_veomni_ops_ms"] for a in after)
    info["after_torch_discover_ms"] = statistics.median(a["discover_ms"] for a in after)
    overhead = med["import_torch_and_discover"] - med["import_torch"]
    overhead_cpu = med_cpu["import_torch_and_discover"] - med_cpu["import_torch"]
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "python": python,
        "runs": runs,
        "warmup": warmup,
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "load_average": load,
        "import_torch_ms": round(med["import_torch"], 1),
        "import_torch_and_discover_ms": round(med["import_torch_and_discover"], 1),
        "discover_only_ms": round(med["discover_only"], 1),
        "overhead_ms": round(overhead, 1),
        "import_torch_cpu_ms": round(med_cpu["import_torch"], 1),
        "import_torch_and_discover_cpu_ms": round(med_cpu["import_torch_and_discover"], 1),
        "discover_only_cpu_ms": round(med_cpu["discover_only"], 1),
        "overhead_cpu_ms": round(overhead_cpu, 1),
        "goal_ms": GOAL_MS,
        "within_goal": overhead <= GOAL_MS,
        "spread_ms": {k: [round(min(v), 1), round(max(v), 1)] for k, v in wall.items()},
        **{k: (round(v, 2) if isinstance(v, float) else v) for k, v in info.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter of the environment to measure")
    ap.add_argument("--runs", type=int, default=20, help="fresh processes per command (median)")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured runs of each command first")
    ap.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    # Measure the installed packages, not a checkout on PYTHONPATH; keep every other variable
    # (VEOMNI_OPS_PLUGINS etc. deliberately change what is measured).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = measure(args.python, args.runs, args.warmup, env)
    print(f"discovery cost, median of {r['runs']} fresh processes ({r['cpu_count']} CPUs, load average "
          f"{r['load_average']}, {r['python']})")
    print("                                        wall         CPU (user+sys)")
    for label, key in [("import torch", "import_torch"), ("import torch + discover()", "import_torch_and_discover"),
                       ("difference", "overhead"), ("import veomni_ops + discover()", "discover_only")]:
        print(f"  {label:<32} {r[key + '_ms']:8.1f} ms  {r[key + '_cpu_ms']:8.1f} ms")
    print(f"  goal: difference <= {GOAL_MS:.0f} ms (wall): {'met' if r['within_goal'] else 'NOT met'}; "
          f"torch imported by discovery alone: {r['torch_imported_by_discovery']}")
    print(f"  in-process: import veomni_ops {r['import_veomni_ops_ms']:.1f} ms, discover() {r['discover_ms']:.1f} ms "
          f"({r['kernels']} kernels)")
    print(f"  in-process after import torch: import veomni_ops {r['after_torch_import_veomni_ops_ms']:.1f} ms + "
          f"discover() {r['after_torch_discover_ms']:.1f} ms = "
          f"{r['after_torch_import_veomni_ops_ms'] + r['after_torch_discover_ms']:.1f} ms")
    print(f"  plugins loaded: {', '.join(r['plugins_loaded']) or 'none'}")
    if r["plugins_failed"]:
        print(f"  plugins failed: {'; '.join(r['plugins_failed'])}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(r, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
