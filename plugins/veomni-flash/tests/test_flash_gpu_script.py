"""gpu/check_flash.py runs end to end (CPU smoke mode with the float64 stand-ins of all three
packages), so it is known to work before it goes to a GPU. Not a measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "gpu", "check_flash.py")
KERNELS = ("flash_attention_2", "flash_attention_3", "flash_attention_4")


def test_check_flash_smoke(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "flash.json"
    r = subprocess.run(
        [sys.executable, SCRIPT, "--smoke", "--cases",
         "padded_causal,packed_position_ids,sliding_window,sp_ulysses_packed_window,fp16_causal,dropout",
         "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["errors"] == [] and res["skipped"] == {}
    # 5 numerics cases x 4 tensors + the dropout row, per kernel; 2 model forms per kernel
    assert res["summary"]["per_kernel"] == {k: {"ok": 23, "of": 23} for k in KERNELS}
    assert {c["tensor"] for c in res["checks"]} == {"out", "dq", "dk", "dv", "dropout"}
    assert {c["case"] for c in res["checks"] if c.get("sp")} == {"sp_ulysses_packed_window"}
    drop = {c["kernel"]: c for c in res["checks"] if c["tensor"] == "dropout"}
    assert drop["flash_attention_2"]["differs_from_eval"] is True
    assert "no attention dropout" in drop["flash_attention_3"]["refused"]
    assert {(m["kernel"], m["form"]) for m in res["model"]} == {
        (k, f) for k in KERNELS for f in ("padded", "packed_position_ids")}
    rows = res["bench"]
    direct = {"flash_attn.flash_attn_func (direct)", "flash_attn_interface.flash_attn_func (direct)",
              "flash_attn.cute.flash_attn_func (direct)"}
    assert {(r["kernel"], r["pass"]) for r in rows} == {
        (k, p) for k in (*KERNELS, *direct, "sdpa") for p in ("fwd", "fwd+bwd")
    }
    for row in rows:
        assert set(row) == {"op", "variant", "kernel", "preset", "shape", "dtype", "pass", "wall_ms", "kernel_ms",
                            "tbps", "tflops", "peak_gib"}
        assert row["op"] == "attention" and row["tbps"] is None and row["wall_ms"] > 0


def test_check_flash_one_kernel_and_a_missing_one(tmp_path):
    """--kernel limits the run to that kernel."""
    out = tmp_path / "flash.json"
    r = subprocess.run(
        [sys.executable, SCRIPT, "--smoke", "--kernel", "flash_attention_2", "--cases", "dense_causal",
         "--skip-model", "--skip-bench", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["kernels"]) == {"flash_attention_2"} and res["summary"]["checks"] == 4
