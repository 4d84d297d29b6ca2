"""Make ``veomni_ops`` and ``veomni_triton`` importable when a GPU script runs from a checkout.

Installed distributions win; otherwise the repository's ``core/src`` and this plugin's
``src`` are put on ``sys.path``. Imported by the scripts in this folder before anything else.
"""

from __future__ import annotations

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN_SRC = os.path.normpath(os.path.join(HERE, "..", "src"))
CORE_SRC = os.path.normpath(os.path.join(HERE, "..", "..", "..", "core", "src"))

for mod, path in (("veomni_ops", CORE_SRC), ("veomni_triton", PLUGIN_SRC)):
    if importlib.util.find_spec(mod) is None and os.path.isdir(path):
        sys.path.insert(0, path)

#: TRITON_INTERPRET=1 VEOMNI_GPU_SMOKE=1: run the scripts' plumbing on the CPU with tiny
#: shapes, so that a script is known to run end to end before it goes to a GPU. Not a measurement.
SMOKE = os.environ.get("VEOMNI_GPU_SMOKE", "0") == "1"

if SMOKE:
    # must be in the environment before anything imports triton (import order is not ours to fix)
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        sys.exit("a smoke run needs the interpreter: run with TRITON_INTERPRET=1 VEOMNI_GPU_SMOKE=1")
elif os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("unset TRITON_INTERPRET: these scripts measure the compiled kernels on a CUDA GPU")


def pick(real, smoke):
    """``real`` on the GPU, ``smoke`` in a smoke run."""
    return smoke if SMOKE else real


def device(purpose: str = "", smoke_name: str = "cpu (smoke run: Triton interpreter, tiny shapes)"):
    """``(torch.device, name)`` to run on: the CPU in a smoke run, else the CUDA GPU. ``None``,
    after saying why on stderr, when there is no CUDA GPU (the scripts then exit with 2)."""
    import torch

    if SMOKE:
        return torch.device("cpu"), smoke_name
    if not torch.cuda.is_available():
        print("no CUDA device" + (f": {purpose}" if purpose else ""), file=sys.stderr)
        return None
    return torch.device("cuda"), torch.cuda.get_device_name()
