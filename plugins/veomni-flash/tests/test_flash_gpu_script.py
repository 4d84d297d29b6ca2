"""gpu/check_fa4.py runs end to end (CPU smoke mode with the float64 stand-in), so it is known to
work before it goes to a GPU. Not a measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "gpu", "check_fa4.py")


def test_check_fa4_smoke(tmp_path):
    out = tmp_path / "fa4.json"
    r = subprocess.run(
        [sys.executable, SCRIPT, "--smoke", "--cases", "padded_causal,packed_position_ids,sliding_window",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["errors"] == []
    assert res["summary"]["checks"] == 12 and res["summary"]["checks_ok"] == 12
    assert {c["tensor"] for c in res["checks"]} == {"out", "dq", "dk", "dv"}
    rows = res["bench"]
    assert {(r["kernel"], r["pass"]) for r in rows} == {
        (k, p) for k in ("flash_attention_4", "flash_attn.cute (direct)", "sdpa") for p in ("fwd", "fwd+bwd")
    }
    for row in rows:
        assert set(row) == {"op", "variant", "kernel", "preset", "shape", "dtype", "pass", "wall_ms", "kernel_ms",
                            "tbps", "tflops", "peak_gib"}
        assert row["op"] == "attention" and row["tbps"] is None and row["wall_ms"] > 0
