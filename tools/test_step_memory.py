"""benchmarks/gpu/step_memory.py without a GPU: the peak, the blocks live then and their categories,
from a small snapshot in the allocator's format (``torch.cuda.memory._snapshot()``: segments with
blocks, ``device_traces`` of alloc / free_requested / free_completed / segment events with frames,
innermost first), and the command's refusal on the CPU.

    pytest tools/test_step_memory.py -q
"""

from __future__ import annotations

import subprocess
import sys

from _scripts import ROOT, load

SCRIPT = ROOT / "benchmarks" / "gpu" / "step_memory.py"
sm = load("step_memory", SCRIPT)
TF = "/site/transformers/models/qwen3/modeling_qwen3.py"
LOOP = {"filename": "/site/veomni_ops/train/loop.py", "line": 300, "name": "_run"}
MARK = {"filename": str(SCRIPT), "line": 1, "name": "_mark_phase"}
OWNERS = {(TF, 10): "Qwen3Attention.forward", (TF, 20): "Qwen3MLP.forward", (TF, 30): "Qwen3RMSNorm.forward"}
MiB = 2**20
# addresses
P1, S1, B0, X, A1, A2, T, L, BT, Z, M = (0x1000 * k for k in range(1, 12))


def f(filename: str, line: int, name: str) -> dict:
    return {"filename": filename, "line": line, "name": name}


def ev(action: str, addr: int, size: int, *frames: dict) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": list(frames) + [LOOP]}


def mark(phase: str) -> list[dict]:
    size = sm.MARK_BASE + sm.PHASES.index(phase)
    return [ev("alloc", M, size, MARK), ev("free_requested", M, size, MARK), ev("free_completed", M, size, MARK)]


def snapshot() -> dict:
    attn = (f("/site/transformers/integrations/sdpa_attention.py", 5, "sdpa_attention_forward"), f(TF, 10, "forward"))
    mlp = (f(TF, 20, "forward"),)
    norm = (f(TF, 30, "forward"),)
    loss = (f("/site/veomni_triton/kernels/cross_entropy.py", 50, "forward"),)
    trace = (
        mark("forward")                                                            # 0..2
        + [ev("free_completed", X, 5000)]                                          # 3: freed before: not live
        + [ev("alloc", A1, 4000, *attn), ev("alloc", A2, 3000, *mlp)]              # 4, 5
        + [ev("alloc", T, 10000, *norm), ev("free_requested", T, 10000, *norm),   # 6: 17000 over the start
           ev("free_completed", T, 10000, *norm)]                                  # 7, 8
        + [{"action": "segment_alloc", "addr": 0x900000, "size": 2 * MiB, "stream": 0, "frames": []}]  # 9
        + [ev("alloc", L, 12000, *loss)]                                           # 10: 19000: the peak
        + mark("backward")                                                         # 11..13
        + [ev("free_requested", B0, 300, f("/site/veomni_ops/train/data.py", 9, "job_batches"))]  # 14
        + [ev("free_requested", L, 12000, *loss), ev("free_requested", A2, 3000, *mlp)]  # 15, 16
        + [ev("alloc", A2, 1000), ev("alloc", BT, 500)]                            # 17, 18: a gradient at A2's address
        + mark("optimizer") + mark("end")                                          # 19..24
        + [ev("alloc", Z, 10**6, *norm)]                                           # 25: after the step: not its peak
    )
    blocks = [
        {"address": P1, "size": 1024, "requested_size": 1000, "state": "active_allocated",
         "frames": [f("/site/veomni_ops/train/model.py", 40, "build_model")]},
        {"address": S1, "size": 2048, "requested_size": 2000, "state": "active_allocated",
         "frames": [f("/site/torch/optim/adamw.py", 70, "_init_group")]},
        {"address": X + 0x100, "size": 512, "requested_size": 7, "state": "inactive", "frames": []},
    ]
    seg = {"device": 0, "address": 0x100000, "total_size": 64 * MiB, "stream": 0, "segment_type": "large",
           "allocated_size": 3072, "active_size": 3072, "blocks": blocks}
    return {"segments": [seg], "device_traces": [trace]}


KNOWN = {"parameters": [P1], "gradients": [A2], "optimizer state": [S1]}
START = 1000 + 2000 + 300  # P1, S1 (in the segments, no event) and B0 (its first event frees it)


def test_the_peak_and_the_blocks_live_then():
    r = sm.replay(snapshot())
    assert r["marks"] == {"forward": 0, "backward": 11, "optimizer": 19, "end": 22}
    assert r["start_bytes"] == START
    assert r["peak_index"] == 10 and r["peak_bytes"] == START + 4000 + 3000 + 12000
    assert {b["addr"] for b in r["live"]} == {P1, S1, B0, A1, A2, L}
    assert r["reserved_at_peak"] == 64 * MiB and r["reserved_at_start"] == 62 * MiB
    by = {b["addr"]: b for b in r["live"]}
    assert by[A1]["phase"] == "forward" and by[P1]["phase"] == "before"
    assert by[A2]["at_optimizer"] is False and by[P1]["at_optimizer"] is True  # A2's address is a gradient's by then


def test_categories_at_the_peak():
    res = sm.analyze(snapshot(), 0, KNOWN, lambda fn, line: OWNERS.get((fn, line)))
    assert res["categories"] == {"fused loss buffers": 12000, "activations: attention": 4000,
                                 "activations: mlp": 3000, "optimizer state": 2000, "parameters": 1000,
                                 "inputs (the step's batch)": 300}
    assert res["phases"] == {"forward": 19000, "before": 3300}
    assert res["top_stacks"][0]["category"] == "fused loss buffers" and res["top_stacks"][0]["bytes"] == 12000
    assert sum(s["bytes"] for s in res["top_stacks"]) == res["peak_bytes"]


def test_a_peak_outside_the_marks_is_not_the_steps():
    snap = snapshot()
    for e in snap["device_traces"][0]:
        if sm.mark_of(e):
            e["frames"] = [LOOP]  # no mark found: the whole trace is searched, and the late allocation wins
    r = sm.replay(snap)
    assert r["marks"] == {} and r["peak_index"] == len(snap["device_traces"][0]) - 1


def test_classify_the_rest():
    def block(phase, *frames, addr=1):
        return {"addr": addr, "size": 1, "frames": list(frames), "phase": phase, "at_optimizer": True}

    inductor = f("/tmp/torchinductor_u/ab/cabc.py", 90, "call")
    moe_norm = f("/site/transformers/models/qwen3_moe/modeling_qwen3_moe.py", 30, "forward")
    owner = {(moe_norm["filename"], 30): "Qwen3MoeRMSNorm.forward"}.get
    assert sm.classify(block("forward", moe_norm), None, lambda fn, line: owner((fn, line))) == "activations: norm"
    assert sm.classify(block("forward", inductor)) == "activations: compiled (inductor)"
    assert sm.classify(block("forward", inductor, f(TF, 20, "forward")), None,
                       lambda fn, line: OWNERS.get((fn, line))) == "activations: compiled, in mlp"
    assert sm.classify(block("before", f("/site/torch/_inductor/utils.py", 1, "x"))) == "compile/inductor"
    assert sm.classify(block("backward")) == "backward temporaries"
    assert sm.classify(block("backward", addr=7), {"gradients": [7]}) == "gradients"
    assert sm.classify(block("optimizer", f("/site/torch/optim/adamw.py", 1, "_fused_adamw"))) == \
        "optimizer temporaries"
    assert sm.classify(block("before")) == "other (before the step)"
    experts = f("/site/veomni_ops/ops/moe_experts/kernel.py", 3, "forward")
    assert sm.classify(block("forward", experts)) == "activations: experts"


def test_source_owners(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("class A:\n    def forward(self):\n        return 1\n\n\ndef g():\n    return 2\n")
    own = sm.SourceOwners()
    assert own(str(src), 3) == "A.forward" and own(str(src), 7) == "g" and own(str(src), 4) is None
    assert own(str(tmp_path / "missing.py"), 1) is None


def test_cpu_refuses_in_one_line_and_dry_run_plans():
    job = "examples/qwen3-small-auto-compile.yaml"
    p = subprocess.run([sys.executable, str(SCRIPT), job, "--device", "cpu"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and len(p.stdout.strip().splitlines()) == 1 and "CUDA" in p.stdout
    p = subprocess.run([sys.executable, str(SCRIPT), job, "--device", "cpu", "--dry-run", "--out", "o"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and "--child ours" in p.stdout and "--child transformers+compile" in p.stdout
