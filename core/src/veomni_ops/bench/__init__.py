"""``veomni-ops bench``: every usable kernel of each op against eager, at named shapes.

    veomni-ops bench                                   default presets for this device
    veomni-ops bench --preset seed --op rms_norm       one preset, one op
    veomni-ops bench --json                            also write benchmarks/results/<device>-<date>.json (+ .md)
    veomni-ops bench --json out.json --plot out.png    chosen paths; the chart needs matplotlib
    veomni-ops bench --from out.json --plot out.png    re-render a saved result (no run)

What is measured, per preset workload, kernel and pass (``fwd``: forward on inputs that do
not require grad; ``fwd+bwd``: forward, then the gradients of every differentiable input
for a fixed random cotangent laid out as the output, as the next layer's backward hands it over):

* wall time per call: median of many calls after warm-up. On CUDA as
  ``triton.testing.do_bench`` does it — each call between its own CUDA events, the L2
  cache flushed (a 256 MiB write) before each, warm-up 50 ms and repeats 300 ms by default;
  on the CPU ``time.perf_counter`` around each call.
* kernel time per call (CUDA): the sum of the durations of all device kernels (and
  copies) ``torch.profiler`` records over 20 calls, divided by 20. Wall minus kernel time
  is launch, Python and autograd overhead.
* achieved rate from the op's minimal traffic or work (see :data:`FORMULAS` and
  ``benchmarks/README.md``), against the device's ceilings measured in the same run:
  device-to-device copy (bytes read + written) and a dense matmul (bf16 8192³ on CUDA,
  fp32 on the CPU); a share of them ("of ceiling") only where the calls were timed with the
  caches flushed (CUDA): a CPU call, timed warm, reads a small workload from cache, faster
  than the copy through memory (:func:`~veomni_ops.bench.render.share_refused`).
* peak memory (CUDA): ``torch.cuda.max_memory_allocated`` over one call, inputs included.
* peers (:mod:`~veomni_ops.bench.peers`): other projects' kernels as their users call them,
  each with a note of what its numbers include (Liger's RoPE rotates in place; veomni-liger's
  ``liger`` row pays for the copies that keep the op functional).

The package, one concern a module:

* :mod:`~veomni_ops.bench.workloads`: presets, formulas, the inputs of one workload
* :mod:`~veomni_ops.bench.timing`: wall and kernel time, peak memory, the device's ceilings
* :mod:`~veomni_ops.bench.environment`: device, versions, environment variables recorded
* :mod:`~veomni_ops.bench.loop`: the run loop and the result document
* :mod:`~veomni_ops.bench.render`, :mod:`~veomni_ops.bench.plot`, :mod:`~veomni_ops.bench.merge`:
  text and Markdown, the chart, merging runs
* :mod:`~veomni_ops.bench.command`: the command's options (``configure``) and ``run``

Module-level imports stay light (no torch): the CLI imports this package to build its parser.
"""

from __future__ import annotations

from .command import configure, run
from .environment import ENV_PREFIXES, VENDOR_DISTRIBUTIONS, device_info, device_slug, environment, versions
from .loop import add_speedups, run_bench
from .merge import merge_results
from .plot import plot
from .render import (
    TABLE_HEAD,
    default_json_path,
    peer_lines,
    rate_cells,
    render_markdown,
    render_text,
    row_ceilings,
    row_cells,
    share_refused,
    table_rows,
    vs_eager_cell,
    write_results,
)
from .timing import GIB, WALL_FLUSHED, Timer, kernel_ms, measure_ceilings, peak_gib
from .workloads import (
    CPU_DEFAULT,
    FORMULAS,
    GPU_DEFAULT,
    PASSES,
    PRESETS,
    Workload,
    build_inputs,
    workloads,
)

__all__ = [
    "CPU_DEFAULT", "ENV_PREFIXES", "FORMULAS", "GIB", "GPU_DEFAULT", "PASSES", "PRESETS", "TABLE_HEAD",
    "VENDOR_DISTRIBUTIONS", "WALL_FLUSHED", "Timer", "Workload", "add_speedups", "build_inputs", "configure", "default_json_path",
    "device_info", "device_slug", "environment", "kernel_ms", "measure_ceilings", "merge_results", "peak_gib",
    "peer_lines", "plot", "rate_cells", "render_markdown", "render_text", "row_cells", "row_ceilings", "run",
    "run_bench", "share_refused", "table_rows", "versions", "vs_eager_cell", "workloads", "write_results",
]
