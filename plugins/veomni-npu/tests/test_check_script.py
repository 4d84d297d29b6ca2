"""gpu/check_npu.py, the script for a real Ascend machine, exercised on the CPU with the
stand-in (``--smoke``): it resolves every npu kernel, runs the conformance cases with the
float64 reference on the CPU, and reports. This checks the script, not the kernels."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "gpu" / "check_npu.py"


def _load():
    spec = importlib.util.spec_from_file_location("check_npu", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smoke_run_checks_every_kernel(tmp_path):
    out = tmp_path / "report.json"
    rc = _load().main(["--smoke", "--sizes", "small", "--dtypes", "bfloat16", "--no-compile", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["ok"], json.dumps(report, indent=1)[:3000]
    kernels = {(k["op"], k["variant"]) for k in report["conformance"]["small"]["kernels"]}
    assert kernels == {("rms_norm", "standard"), ("rms_norm", "offset"), ("rotary", "full"), ("rotary", "partial"),
                       ("swiglu", "standard"), ("moe_experts", "standard"), ("attention", "standard")}
    for k in report["conformance"]["small"]["kernels"]:
        # the one input form a kernel refuses: an additive attention mask (npu_fusion_attention takes booleans)
        assert k["cases"] and all(c["status"] == "pass" or (c["status"] == "unsupported" and "additive" in c["case"])
                                  for c in k["cases"])
    statuses = [c["status"] for k in report["conformance"]["small"]["kernels"] for c in k["cases"]]
    assert statuses.count("unsupported") == 1


def test_without_an_npu_it_refuses_to_report_success(tmp_path):
    # Not --smoke: the stand-in is not an NPU, so nothing is checked and the exit status says so.
    out = tmp_path / "report.json"
    rc = _load().main(["--sizes", "small", "--no-compile", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 1 and not report["ok"] and "no real Ascend NPU" in report["error"]
