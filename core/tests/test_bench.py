"""`veomni-ops bench`: result schema, Markdown rendering, formulas, device names, the plot switch."""

import argparse
import importlib.util
import json

import pytest
import torch
from conftest import make_plugin
from veomni_ops import KernelSpec, build_registry
from veomni_ops import bench as B
from veomni_ops.backends import reference

ROW_KEYS = {"op", "variant", "kernel", "distribution", "version", "preset", "shape", "dtype", "pass", "wall_ms",
            "kernel_ms", "tbps", "tflops", "peak_gib", "extra_gib", "peer"}


def _mine(gate, up):
    return torch.nn.functional.silu(gate) * up


def registry():
    mine = make_plugin("mine", swiglu=[KernelSpec(name="mine", op="swiglu", variant="standard",
                                                  factory=lambda: _mine, dtypes=("float32",))])
    return build_registry([("veomni-ops", reference), ("mine", mine)], include_entry_points=False, env={})


def bench_args(**kw):
    base = dict(list=False, plot=None, op="swiglu", preset=["cpu-small"], backend=None, passes=None, json=None,
                from_file=None, warmup_ms=1.0, rep_ms=3.0, quiet=True, registry=registry(),
                argv=["bench", "--preset", "cpu-small", "--op", "swiglu"])
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.fixture(scope="module")
def result_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "cpu-test.json"
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes: threads only add hand-off noise
    try:
        assert B.run(bench_args(json=str(path))) == 0
    finally:
        torch.set_num_threads(before)
    return path


def test_json_schema(result_file):
    res = json.loads(result_file.read_text())
    for key in ("device", "device_name", "ceilings", "versions", "command", "date", "rows", "presets", "formulas"):
        assert key in res, key
    assert res["device"] == B.device_info()["slug"]
    assert set(res["ceilings"]) >= {"copy_tbps", "matmul_tflops"}
    assert res["ceilings"]["copy_tbps"] > 0 and res["ceilings"]["matmul_tflops"] > 0
    assert res["versions"]["torch"] == torch.__version__
    assert "veomni-ops" in res["versions"]
    assert res["command"] == "veomni-ops bench --preset cpu-small --op swiglu"
    rows = res["rows"]
    assert {(r["kernel"], r["pass"]) for r in rows} == {("eager", "fwd"), ("eager", "fwd+bwd"),
                                                      ("mine", "fwd"), ("mine", "fwd+bwd")}
    for r in rows:
        assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
        assert r["error"] is None and r["wall_ms"] > 0
        assert r["tbps"] > 0 and r["tflops"] is None  # swiglu is bandwidth-bound: TB/s
        assert r["shape"] == {"tokens": 256, "intermediate": 1024} and r["dtype"] == "float32"
        assert r["preset"] == "cpu-small" and r["op"] == "swiglu" and r["variant"] == "standard"
        if torch.cuda.is_available():
            assert r["kernel_ms"] > 0 and r["peak_gib"] > 0
        else:
            assert r["kernel_ms"] is None and r["peak_gib"] is None and r["extra_gib"] is None
        assert r["peer"] is False
    eager = [r for r in rows if r["kernel"] == "eager"]
    assert all(r["vs_eager"] == 1.0 for r in eager)
    # TB/s is the op's minimal bytes over the measured time: 3·N·I·4 bytes forward
    fwd = next(r for r in eager if r["pass"] == "fwd")
    assert fwd["tbps"] == pytest.approx(3 * 256 * 1024 * 4 / (fwd["wall_ms"] * 1e-3) / 1e12, rel=1e-2)


def test_markdown_beside_json(result_file):
    md = result_file.with_suffix(".md").read_text()
    assert md.startswith("# veomni-ops bench: ")
    assert "## cpu-small" in md
    assert "| swiglu | standard | tokens=256 intermediate=1024 float32 | fwd | eager (veomni-ops local) |" in md
    assert "| swiglu | standard | tokens=256 intermediate=1024 float32 | fwd+bwd | mine (mine local) |" in md
    assert "Ceilings measured in the same run" in md and "## Formulas" in md


def test_render_from_saved_and_plot_switch(result_file, tmp_path, capsys):
    png = tmp_path / "chart.png"
    rc = B.run(bench_args(from_file=str(result_file), plot=str(png), registry=None))
    cap = capsys.readouterr()
    if importlib.util.find_spec("matplotlib") is None:
        assert rc == 2
        assert "pip install matplotlib" in cap.err and not png.exists()
    else:
        assert rc == 0 and png.stat().st_size > 1000
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # without --plot the saved result renders as the table
    assert B.run(bench_args(from_file=str(result_file), registry=None)) == 0
    out = capsys.readouterr().out
    assert "veomni-ops bench on" in out and "swiglu" in out and "mine" in out


def test_no_share_of_ceiling_for_a_run_timed_warm(result_file):
    """On the CPU each call is timed warm (no cache flush, as CUDA's timing does), against a 64
    MiB copy through memory: a small workload read from cache beat it (">100% of ceiling"). Such
    a run gives no share, and says why; a run timed with the caches flushed does."""
    saved = json.loads(result_file.read_text())
    # as a CPU run records it (results saved before this change too): the share goes by how it was timed
    res = dict(saved, timing=dict(saved["timing"], wall="time.perf_counter per call"))
    assert torch.cuda.is_available() or saved == res
    warm = B.render_text(res).splitlines()
    col = B.TABLE_HEAD.index("of ceiling")
    assert {row[col] for row in B.table_rows(res)} == {"-"}, B.table_rows(res)
    assert "of ceiling: not given off CUDA: each call is timed warm" in warm[-1 - len(res.get("peers", []))]
    assert "Of ceiling: not given off CUDA" in B.render_markdown(res)
    flushed = dict(res, timing=dict(res["timing"], wall=B.WALL_FLUSHED))
    c = flushed["ceilings"]["copy_tbps"]
    assert [row[col] for row in B.table_rows(flushed)] == [f"{100 * r['tbps'] / c:.0f}%" for r in res["rows"]]
    assert "of ceiling:" not in B.render_text(flushed) and "Of ceiling:" not in B.render_markdown(flushed)


def _part(result_file, tmp_path, name, op, ceiling, **changes):
    doc = json.loads(result_file.read_text())
    doc["rows"] = [dict(r, op=op) for r in doc["rows"]]
    doc["command"] = f"veomni-ops bench --op {op}"
    doc["ceilings"] = dict(doc["ceilings"], copy_tbps=ceiling)
    doc.update(changes)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_merge_parts_of_one_run(result_file, tmp_path, capsys):
    a = _part(result_file, tmp_path, "a.json", "swiglu", 1.0)
    b = _part(result_file, tmp_path, "b.json", "rms_norm", 2.0, partial=True)
    out = tmp_path / "merged.json"
    assert B.run(bench_args(from_file=[str(a), str(b)], json=str(out), registry=None)) == 0
    capsys.readouterr()
    m = json.loads(out.read_text())
    assert len(m["rows"]) == 8 and {r["part"] for r in m["rows"]} == {0, 1}
    assert [p["command"] for p in m["parts"]] == ["veomni-ops bench --op swiglu", "veomni-ops bench --op rms_norm"]
    assert m["partial"] is True  # one part was cut short: the merge says so
    # each row's share of the ceiling uses the ceiling measured in its own run
    row_a = next(r for r in m["rows"] if r["part"] == 0 and r["tbps"])
    row_b = next(r for r in m["rows"] if r["part"] == 1 and r["tbps"] == row_a["tbps"])
    ca, cb = B.rate_cells(row_a, B.row_ceilings(m, row_a))[1], B.rate_cells(row_b, B.row_ceilings(m, row_b))[1]
    assert ca == f"{100 * row_a['tbps']:.0f}%" and cb == f"{50 * row_a['tbps']:.0f}%"
    md = (tmp_path / "merged.md").read_text()
    assert "Merged from 2 runs" in md and "`veomni-ops bench --op rms_norm`" in md and "cut short" in md
    # vs_eager is recomputed within each op
    assert all(r["vs_eager"] == 1.0 for r in m["rows"] if r["kernel"] == "eager")


@pytest.mark.parametrize("change, words", [
    ({"device_name": "Other GPU"}, "differ in device"),
    ({"versions": {"torch": "0.0"}}, "differ in library versions: "),
    ({"timing": {"rep_ms": 1}}, "differ in timing settings"),
    ({"environment": {"LIGER_FUSED_MOE_AUTOTUNE": "0"}}, "environment variables: LIGER_FUSED_MOE_AUTOTUNE None vs 0"),
])
def test_merge_refuses_different_runs(result_file, tmp_path, capsys, change, words):
    a = _part(result_file, tmp_path, "a.json", "swiglu", 1.0)
    b = _part(result_file, tmp_path, "b.json", "rms_norm", 1.0, **change)
    assert B.run(bench_args(from_file=[str(a), str(b)], registry=None)) == 2
    err = capsys.readouterr().err
    assert words in err and "a.json" in err and "b.json" in err


def test_merge_refuses_a_row_measured_twice(result_file, tmp_path, capsys):
    a = _part(result_file, tmp_path, "a.json", "swiglu", 1.0)
    assert B.run(bench_args(from_file=[str(a), str(a)], registry=None)) == 2
    assert "both measured" in capsys.readouterr().err
    assert B.run(bench_args(from_file=[str(tmp_path / "missing.json")], registry=None)) == 2
    assert "cannot read --from" in capsys.readouterr().err


def test_environment_that_changes_kernels_is_recorded(monkeypatch):
    monkeypatch.setenv("LIGER_FUSED_MOE_AUTOTUNE", "0")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("HOME_UNRELATED_SECRET", "x")
    env = B.environment()
    assert env["LIGER_FUSED_MOE_AUTOTUNE"] == "0" and env["TRITON_INTERPRET"] == "1"
    assert "HOME_UNRELATED_SECRET" not in env
    doc = {"device": "cpu", "device_name": "cpu", "date": "d", "rows": [], "environment": env}
    assert "`LIGER_FUSED_MOE_AUTOTUNE=0`" in B.render_markdown(doc)


def test_backend_filter_keeps_eager_baseline():
    res = B.run_bench(presets=["cpu-small"], op="rms_norm", backend="mine", registry=registry(), warmup_ms=1,
                      rep_ms=2, progress=False, passes=("fwd",))
    assert {r["kernel"] for r in res["rows"]} == {"eager"}  # "mine" has no rms_norm; eager is the baseline
    assert {r["variant"] for r in res["rows"]} == {"standard", "offset"}


def test_seed_formulas_match_the_anchors():
    wl = {(w.op, w.variant): w for w in B.workloads(["seed"])}
    rms = wl[("rms_norm", "standard")]
    # ANCHORS.md: eager RMSNorm fwd 0.333 ms kernel time = 0.25 TB/s -> 2·N·H·2 bytes
    assert rms.amount("fwd") == pytest.approx(2 * 8192 * 2560 * 2, rel=1e-3)
    assert rms.amount("fwd") / 0.333e-3 / 1e12 == pytest.approx(0.25, abs=0.01)
    # Liger fwd+bwd 0.120 ms = 1.75 TB/s -> 5·N·H·2 bytes
    assert rms.amount("fwd+bwd") / 0.120e-3 / 1e12 == pytest.approx(1.75, abs=0.02)
    sw = wl[("swiglu", "standard")]
    assert sw.amount("fwd") / 0.188e-3 / 1e12 == pytest.approx(1.81, abs=0.02)
    assert sw.amount("fwd+bwd") / 0.524e-3 / 1e12 == pytest.approx(1.73, abs=0.02)
    moe = B.workloads(["moe-30b-a3b"])[0]
    assert moe.amount("fwd") / 3.22e-3 / 1e12 == pytest.approx(192, abs=1)
    assert moe.amount("fwd+bwd") / 7.00e-3 / 1e12 == pytest.approx(265, abs=1)
    attn = B.workloads(["attn"])[0]
    assert attn.amount("fwd") / 0.95e-3 / 1e12 == pytest.approx(578, abs=2)
    lbl = B.workloads(["lbl-48"])[0]
    assert lbl.amount("fwd") / 5.13e-3 / 1e12 == pytest.approx(0.04, abs=0.002)


def test_presets():
    assert set(B.GPU_DEFAULT) <= set(B.PRESETS) and "cpu-small" in B.PRESETS
    ops = {w.op for w in B.workloads(["cpu-small"])}
    assert ops == {"rms_norm", "residual_rms_norm", "rotary", "swiglu", "cross_entropy", "moe_router", "moe_experts",
                   "load_balancing_loss", "attention"}
    flce = {w.shape["tokens"] for p in ("flce-8k", "flce-16k", "flce-32k") for w in B.workloads([p])}
    assert flce == {8192, 16384, 32768}
    with pytest.raises(SystemExit, match="unknown preset 'nope'"):
        B.workloads(["nope"])


def test_attention_preset_with_qwen3_30b_a3b_heads():
    """attn-30b-a3b: the attn preset's tokens with Qwen3-30B-A3B's heads (32 q / 4 kv of 128), in the default run."""
    (w,) = B.workloads(["attn-30b-a3b"])
    (base,) = B.workloads(["attn"])
    assert (w.op, w.variant, w.dtype, w.metric) == ("attention", "standard", "bfloat16", "flops")
    assert {k: w.shape[k] for k in ("q_heads", "kv_heads", "head_dim", "causal")} == \
        {"q_heads": 32, "kv_heads": 4, "head_dim": 128, "causal": 1}
    assert (w.shape["batch"], w.shape["seq"]) == (base.shape["batch"], base.shape["seq"])
    # FLOPs depend on the query heads only: the same as attn's (32 q heads), for fwd and fwd+bwd
    assert w.amount("fwd") == base.amount("fwd") and w.amount("fwd+bwd") == 3.5 * w.amount("fwd")
    assert "attn-30b-a3b" in B.GPU_DEFAULT
    inputs, diff = B.build_inputs(B.Workload("t", "attention", "standard", "float32", dict(w.shape, batch=1, seq=8),
                                             "flops", "attention"), "cpu")
    assert diff == ("query", "key", "value")
    assert inputs["query"].shape == (1, 32, 8, 128) and inputs["key"].shape == (1, 4, 8, 128)


def test_presets_folded_from_the_gpu_scripts():
    """The shapes the plugins' GPU scripts measured are presets now (opt-in: not in the default run)."""
    (rope,) = B.workloads(["rope-qwen35"])
    assert (rope.op, rope.variant, rope.shape["head_dim"], rope.shape["rotary_dim"]) == ("rotary", "partial", 256, 64)
    (lbl,) = B.workloads(["lbl-48-masked"])
    assert lbl.shape["masked"] == 1 and lbl.shape["tokens"] % lbl.shape["batch"] == 0
    assert lbl.amount("fwd") == B.workloads(["lbl-48"])[0].amount("fwd")
    assert {w.op for w in B.workloads(["host"])} == {"rms_norm", "rotary", "swiglu"}
    assert not {"rope-qwen35", "lbl-48-masked", "host"} & set(B.GPU_DEFAULT)
    for name in ("rope-qwen35", "lbl-48-masked", "host"):
        for w in B.workloads([name]):
            assert w.amount("fwd") > 0 and w.amount("fwd+bwd") > w.amount("fwd")


def test_masked_load_balancing_workload_runs_on_the_cpu():
    torch = pytest.importorskip("torch")
    w = B.Workload("t", "load_balancing_loss", "standard", "float32", dict(layers=2, tokens=32, experts=8, top_k=2,
                                                                            batch=2, masked=1), "bytes",
                   "load_balancing_loss")
    inputs, diff = B.build_inputs(w, "cpu")
    mask = inputs["attention_mask"]
    assert mask.shape == (2, 16) and int(mask.sum()) == 2 * 14 and diff == ("gate_logits",)
    from veomni_ops.kernels.load_balancing import load_balancing_loss

    loss = load_balancing_loss(inputs["gate_logits"], 8, 2, mask)
    assert torch.isfinite(loss)


@pytest.mark.parametrize("name,kind,slug", [
    ("NVIDIA H100 80GB HBM3", "cuda", "h100-sxm"),
    ("NVIDIA H100 PCIe", "cuda", "h100-pcie"),
    ("NVIDIA H100 NVL", "cuda", "h100-nvl"),
    ("NVIDIA H200", "cuda", "nvidia-h200".removeprefix("nvidia-")),
    ("NVIDIA A100-SXM4-80GB", "cuda", "a100-sxm4-80gb"),
    ("anything", "cpu", "cpu"),
])
def test_device_slug(name, kind, slug):
    assert B.device_slug(name, kind) == slug


def test_cpu_timer_is_a_median():
    calls = []
    t = B.Timer(torch.device("cpu"), warmup_ms=0.0, rep_ms=0.0, min_reps=7)
    ms = t.wall_ms(lambda: calls.append(1))
    assert ms >= 0 and len(calls) >= 8  # one warm-up call, then at least min_reps timed


def test_peers_are_rows_where_installed_and_say_so(monkeypatch):
    """A peer (another project's kernel, not registered) is measured beside the kernels where its
    distribution is installed and it runs on this device; elsewhere it is listed as not run, with
    the reason; an uninstalled one is absent; a --backend filter leaves peers out."""
    from veomni_ops.bench import peers as P

    fake = [
        P.Peer("torch-silu", "pytest", "swiglu", "standard", lambda: _mine, "F.silu(gate) * up",
               device_types=("cpu", "cuda")),
        P.Peer("gpu-only", "pytest", "swiglu", "standard", lambda: _mine, "a CUDA kernel", device_types=("cuda",)),
        P.Peer("absent", "no-such-distribution-xyz", "swiglu", "standard", lambda: _mine, "not installed"),
    ]
    monkeypatch.setattr(P, "PEERS", tuple(fake))
    res = B.run_bench(presets=["cpu-small"], op="swiglu", registry=registry(), warmup_ms=1, rep_ms=2,
                      progress=False)
    peer_rows = [r for r in res["rows"] if r["peer"]]
    assert {(r["kernel"], r["pass"]) for r in peer_rows} == {("torch-silu", "fwd"), ("torch-silu", "fwd+bwd")}
    assert all(r["distribution"] == "pytest" and r["error"] is None and r["wall_ms"] > 0 for r in peer_rows)
    skipped = {s["kernel"]: s["reason"] for s in res["skipped"]}
    assert skipped.get("gpu-only") == "peer, runs on cuda only" and "absent" not in skipped
    md = B.render_markdown(res)
    assert "torch-silu (peer) (pytest " in md and "extra GiB" in md
    res2 = B.run_bench(presets=["cpu-small"], op="swiglu", backend="mine", registry=registry(), warmup_ms=1,
                       rep_ms=2, progress=False)
    assert not any(r["peer"] for r in res2["rows"])
