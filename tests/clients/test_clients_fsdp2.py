"""A user's own FSDP2 loop (``fully_shard`` per decoder layer and on the root, after
``veomni_ops.apply``), on 2 real processes with gloo, against the same script on the unbound
model: per-step global losses, full gradient norms, and the first step's gathered gradients.

Each job is one pair of processes (fsdp2_worker.py) that runs the unbound script and then the
bound one, so both see the same process group, seed and data.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from clients_support import (
    BF16_GRAD,
    BF16_LOSS,
    FP32_GRAD_LATER,
    FP32_LOSS,
    MODELS,
    assert_grads_close,
    assert_losses_close,
)

if not torch.distributed.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

HERE = Path(__file__).resolve().parent
WORKER = HERE / "fsdp2_worker.py"
WORLD = 2
STEPS = 5
#: both processes end within this, or the test fails (and kills them)
JOB_TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(spec: dict, tmp_path: Path) -> dict:
    """Start WORLD ranks of the worker as torchrun would, wait for all, load rank 0's result."""
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    port = str(_free_port())
    procs = []
    t0 = time.monotonic()
    for r in range(WORLD):
        log = open(tmp_path / f"rank{r}.log", "w+")
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(WORLD),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
        env.pop("VEOMNI_OPS_DEVICE", None)
        procs.append((subprocess.Popen([sys.executable, str(WORKER), str(tmp_path / "spec.json"), str(tmp_path)],
                                       env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(HERE)), log))
    logs = []
    for p, log in procs:
        try:
            rc = p.wait(timeout=max(1.0, JOB_TIMEOUT_S - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for q, _ in procs:
                if q.poll() is None:
                    q.kill()
            rc = "timeout"
        log.seek(0)
        logs.append((rc, log.read()))
        log.close()
    report = "\n".join(f"--- rank {r} (exit {rc}):\n{text[-4000:]}" for r, (rc, text) in enumerate(logs))
    assert all(rc == 0 for rc, _ in logs), f"the FSDP2 job failed:\n{report}"
    return torch.load(tmp_path / "result.pt")


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", MODELS)
def test_users_fsdp2_loop_on_2_processes_matches_unbound(name, bf16, tmp_path):
    res = _launch({"name": name, "steps": STEPS, "bf16": bf16}, tmp_path)
    u, b = res["unbound"], res["bound"]
    what = f"FSDP2 ({WORLD} gloo processes, {'bf16 MixedPrecisionPolicy' if bf16 else 'fp32'}) of {name}"
    assert b["summary"].get("cross_entropy") == 1, f"{what}: the loss head was not bound: {b['summary']}"
    assert_losses_close(u["losses"], b["losses"], BF16_LOSS if bf16 else FP32_LOSS, f"{what}: global loss")
    assert len(b["losses"]) == STEPS
    assert_losses_close(u["grad_norms"], b["grad_norms"], BF16_GRAD if bf16 else FP32_GRAD_LATER,
                        f"{what}: full gradient norm")
    assert_grads_close(u["grads0"], b["grads0"], f"{what}: first step's gradients", bf16=bf16)
    assert all(b["logits_none"]), f"{what}: the bound head did not take the fused loss in training: {b['logits_none']}"
