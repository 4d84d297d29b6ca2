"""A restart that loses nothing (``torchrun --max-restarts`` with ``train.resume: auto``,
:mod:`veomni_ops.train.restart`) and a hung rank named within ``parallel.timeout_s``
(:mod:`veomni_ops.parallel.hangs`): real ``veomni-ops train`` jobs of 2 processes under torchrun
on the CPU (gloo), a tiny Qwen3, with the test hooks of :mod:`veomni_ops.train.restart`. Every
launcher has a hard timeout: a hang fails the test.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if not torch.distributed.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import parallel_worker as W  # noqa: E402
from test_parallel import _env, _free_port  # noqa: E402
from veomni_ops.train.restart import HANG_ENV, KILL_ENV, Progress, announce, fault_hooks, layout_change  # noqa: E402

JOB_TIMEOUT_S = 300


def _job(tmp_path: Path, name: str, parallel: dict, **train) -> Path:
    import yaml

    job = {"model": {"architecture": "qwen3", "size": "tiny",
                     "config": {k: v for k, v in W.TINY.items() if not k.startswith(("moe_", "num_experts"))}},
           "train": {"batch_size": 2, "seq_len": 16, "steps": 6, "lr": 1e-3, "dtype": "float32", "device": "cpu",
                     "seed": 0, **train},
           "parallel": parallel}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(job))
    return path


def torchrun(job: Path, result: Path, *, restarts: int = 0, env: dict | None = None,
             timeout: float = JOB_TIMEOUT_S) -> dict:
    """``torchrun --nproc-per-node 2 --max-restarts restarts -m veomni_ops.cli train JOB``: rc
    (None: killed at the timeout), output, seconds."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--max-restarts", str(restarts), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
           "-m", "veomni_ops.cli", "train", str(job), "--result-file", str(result)]
    t0 = time.monotonic()
    with open(result.with_suffix(".log"), "w+") as log:
        p = subprocess.Popen(cmd, env=_env(**(env or {})), stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = None
        ended = time.time()
        log.seek(0)
        return {"rc": rc, "output": log.read(), "seconds": time.monotonic() - t0, "ended": ended}


def test_hooks_and_resume_auto_say_what_they_do(tmp_path, monkeypatch, capsys):
    import io

    out = io.StringIO()
    announce({"resume": "auto", "checkpoint_dir": str(tmp_path)}, None, out)
    announce({"resume": "auto", "checkpoint_dir": str(tmp_path)}, str(tmp_path / "step-00000002"), out)
    announce({"resume": True, "checkpoint_dir": str(tmp_path)}, None, out)  # not auto: nothing to choose
    assert out.getvalue().splitlines() == [
        f"resume: auto: no complete checkpoint in {tmp_path}, starting from step 0",
        f"resume: auto: resuming from the latest complete checkpoint, {tmp_path / 'step-00000002'}"]
    monkeypatch.setenv(KILL_ENV, "1-3")
    with pytest.raises(ValueError, match=rf"{KILL_ENV}='1-3': give RANK:STEP"):
        fault_hooks(3, 1)
    monkeypatch.setenv(KILL_ENV, "1:3")
    monkeypatch.setenv(HANG_ENV, "0:3")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    fault_hooks(3, 1)  # a restarted attempt runs clean
    fault_hooks(3, 0)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    fault_hooks(2, 1)  # another step
    # progress: rank 0 notes each step; a resume past an earlier attempt's last step says what was lost
    p = Progress({"checkpoint_dir": str(tmp_path)}, 0)
    p.step_done(5, 0.5)
    facts = p.resumed(4, out)
    assert facts is not None and facts["lost_steps"] == 1 and facts["recompute_s"] == 0.5
    assert "1 step(s) are recomputed" in out.getvalue()
    assert p.resumed(6, out) is None  # the checkpoint is past the note: a plain resume
    assert Progress({"checkpoint_dir": str(tmp_path)}, 1).resumed(4, out) is None  # rank 0 alone says it
    # a resume under another layout says so (a checkpoint from before dp_replicate: 1)
    assert layout_change({"dp_shard": 2, "sp": 1, "ep": 1}, {"dp_replicate": 1, "dp_shard": 2, "sp": 1}) is None
    assert layout_change(None, None) is None
    assert layout_change({"dp_shard": 2, "sp": 1, "ep": 1}, {"dp_replicate": 2, "dp_shard": 1, "sp": 1}).startswith(
        "another layout than the checkpoint's (dp_replicate 1 -> 2, dp_shard 2 -> 1)")
    # parallel.reduce_dtype: said, not refused (a checkpoint without the key reduced in float32)
    assert layout_change({"dp_shard": 2}, {"dp_shard": 2, "reduce_dtype": "float32"}) is None
    assert layout_change({"dp_shard": 2}, {"dp_shard": 2, "reduce_dtype": "bfloat16"}).startswith(
        "another layout than the checkpoint's (reduce_dtype float32 -> bfloat16)")
    # ep_chunks too (issue 36): a checkpoint without the key was written with 1
    assert layout_change({"dp_shard": 2, "ep": 2}, {"dp_shard": 2, "ep": 2, "ep_chunks": 1}) is None
    assert layout_change({"dp_shard": 2, "ep": 2}, {"dp_shard": 2, "ep": 2, "ep_chunks": 4}).startswith(
        "another layout than the checkpoint's (ep_chunks 1 -> 4)")


@pytest.mark.parallel
def test_a_killed_rank_restarts_the_group_and_the_job_loses_nothing(tmp_path):
    """Rank 1 SIGKILLs itself before step 5 (steps 1-4 done, a checkpoint after step 3) of a
    ``dp_replicate: 2`` (HSDP) job; torchrun restarts both ranks, the job resumes from step 3, says
    what it lost (step 4, recomputed) and finishes by itself with exit 0; its losses are those of
    the same job never stopped, bitwise."""
    every, kill_at = 3, 5
    layout = {"dp_replicate": 2, "timeout_s": 60}
    job = _job(tmp_path, "job.yaml", layout, checkpoint_dir="ckpt", checkpoint_every=every, resume="auto")
    whole = _job(tmp_path, "whole.yaml", layout)
    got = torchrun(job, tmp_path / "job.json", restarts=1, env={KILL_ENV: f"1:{kill_at}"})
    assert got["rc"] == 0, got["output"][-8000:]
    ref = torchrun(whole, tmp_path / "whole.json")
    assert ref["rc"] == 0, ref["output"][-8000:]
    res, want = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("job", "whole"))
    assert len(res["losses"]) == len(want["losses"]) == 6
    assert res["losses"] == want["losses"], (res["losses"], want["losses"])
    out = got["output"]
    assert f"{KILL_ENV}: rank 1 kills itself (SIGKILL) before step {kill_at}" in out
    assert "no complete checkpoint" in out and "starting from step 0" in out  # the first attempt
    assert "resume: auto (torchrun attempt 2): resuming from the latest complete checkpoint" in out, out[-6000:]
    restart = res["restart"]
    assert restart["resumed_step"] == 3 and restart["attempt"] == 1
    assert 0 <= restart["lost_steps"] <= every and restart["lost_steps"] == kill_at - 1 - 3
    assert "restart: resuming after step 3 (the last complete checkpoint)" in out
    assert res["first_step"] == 4 and res["parallel"]["dp_replicate"] == 2
    info = json.loads((tmp_path / "ckpt" / "step-00000006" / "veomni_ops.json").read_text())
    assert info["layout"]["dp_replicate"] == 2 and info["world_size"] == 2


@pytest.mark.parallel
def test_a_hung_rank_ends_the_job_within_the_timeout_naming_it(tmp_path):
    timeout_s = 15
    job = _job(tmp_path, "hang.yaml", {"dp_shard": 2, "timeout_s": timeout_s}, steps=4)
    got = torchrun(job, tmp_path / "hang.json", env={HANG_ENV: "1:3"}, timeout=240)
    out = got["output"]
    assert got["rc"] not in (0, None), out[-8000:]
    assert f"{HANG_ENV}: rank 1 hangs before step 3" in out
    error = json.loads((tmp_path / "hang.json").read_text())["error"]
    assert "rank 1 of 2 failed: hung: alive (its heartbeat goes on) but it never reached the collective that rank 0 " \
           f"waited {timeout_s} s in (parallel.timeout_s)" in error, (error, out[-6000:])
    assert "veomni-ops: rank 1 of 2 failed: hung: alive" in out  # the hung rank's own end says it too
    # from the hang to the launcher's end: the timeout, the naming (a few seconds) and torchrun's stop
    hung_at = float(re.search(r"hangs before step 3 \(at unix time ([0-9.]+)\)", out).group(1))
    assert got["ended"] - hung_at < timeout_s + 20, (got["ended"] - hung_at, out[-4000:])
