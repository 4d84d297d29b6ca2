"""``veomni-ops train``: the checks of --compare, --steps, model.config_file, baselines, --plot.

CPU, tiny models, a few steps. Most comparisons run their children in this process
(``_run_child`` monkeypatched); one test goes through real child processes.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import io
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from veomni_ops import train  # noqa: E402
from veomni_ops.cli import main  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

TINY = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64, "vocab_size": 128,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}
OPS_AUTO = {"rms_norm_implementation": "auto", "cross_entropy_loss_implementation": "auto",
            "attn_implementation": "auto"}
OPS_EAGER = {"rms_norm_implementation": "eager", "cross_entropy_loss_implementation": "eager",
             "attn_implementation": "eager"}


def write_job(tmp_path, name="job.yaml", ops=None, model=None, **train_fields):
    import yaml

    train_cfg = {"batch_size": 2, "seq_len": 8, "steps": 3, "lr": 1e-3, "dtype": "float32", "device": "cpu",
                 "seed": 0, **train_fields}
    model_cfg = model if model is not None else {"architecture": "qwen3", "size": "tiny", "config": dict(TINY)}
    model_cfg = {**model_cfg, "ops_implementation": ops or OPS_AUTO}
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"model": model_cfg, "train": train_cfg}))
    return str(path)


def _in_process(path, seed, steps=None, baseline=None, lock=None, defaults="auto"):
    """``run_child`` without the child: same job, this process (fast; no peak-memory isolation)."""
    job = train.load_job(path, defaults=defaults)
    if lock is not None:
        from veomni_ops.lock import LockFile

        job["lock"] = LockFile(lock, explicit=True, origin="--lock")
    if seed is not None:
        job["train"]["seed"] = seed
    if steps is not None:
        job["train"]["steps"] = steps
    return json.loads(json.dumps(train.train_one(job, out=io.StringIO(), baseline=baseline)))


@pytest.fixture
def in_process(monkeypatch):
    monkeypatch.setattr(train.command, "run_child", _in_process)


# ----------------------------------------------------------------------------------------
# the loss check
# ----------------------------------------------------------------------------------------


def test_default_tolerance_by_dtype():
    assert train.default_loss_tol([{"dtype": "float32"}, {"dtype": "float32"}]) == train.LOSS_TOL_FP32 == 1e-3
    assert train.default_loss_tol([{"dtype": "float32"}, {"dtype": "bfloat16"}]) == train.LOSS_TOL_LOW_PRECISION
    assert train.default_loss_tol([{"dtype": "float16"}]) == 2e-2


def test_check_run_is_relative_with_a_floor_of_one():
    ref = {"run": "a", "losses": [10.0, 0.1]}
    # 10.0: allowed 1e-3 x 10 = 0.01; 0.1: allowed 1e-3 x max(0.1, 1) = 1e-3
    assert train.check_run(ref, {"run": "b", "losses": [10.009, 0.1009]}, 1e-3)["passed"]
    bad = train.check_run(ref, {"run": "b", "losses": [10.0, 0.1011]}, 1e-3)
    assert not bad["passed"] and bad["worst_step"] == 2 and "OVER" in bad["message"]
    nan = train.check_run(ref, {"run": "b", "losses": [10.0, math.nan]}, 1e-3)
    assert not nan["passed"] and nan["nonfinite_steps"] == [[2, "nan"]] and "not finite" in nan["message"]
    assert not train.check_run(ref, ref | {"losses": [math.inf, 1.0]}, 1e-3)["passed"]  # the reference too


def test_rate_stats_excludes_warmup():
    s = train.rate_stats([1.0, 100.0, 200.0, 300.0], warmup=1)
    assert s["tokens_per_s"] == 200.0 and s["tokens_per_s_min"] == 100.0 and s["warmup_steps"] == 1
    assert s["timed_steps"] == [2, 4] and s["tokens_per_s_p25"] == 150.0 and s["tokens_per_s_p75"] == 250.0
    s = train.rate_stats([1.0, 2.0, 300.0], warmup=2)
    assert s["tokens_per_s"] == 300.0 and s["timed_steps"] == [3, 3]
    s = train.rate_stats([5.0], warmup=2)  # nothing left after warm-up: every step, and it says so
    assert s["tokens_per_s"] == 5.0 and s["warmup_steps"] == 0


def test_compare_equal_losses_pass(tmp_path, in_process, capsys):
    a = write_job(tmp_path, "auto.yaml", OPS_AUTO)
    b = write_job(tmp_path, "eager.yaml", OPS_EAGER)
    assert main(["train", a, "--compare", b]) == 0
    out = capsys.readouterr().out
    assert "PASS eager.yaml" in out and "PASS: 2/2" in out
    assert "(CPU timing: noisy)" in out and "[p25..p75]" in out
    assert "0.001 x max(|loss of auto.yaml|, 1)" in out


def test_compare_different_lr_fails(tmp_path, in_process, capsys):
    a = write_job(tmp_path, "a.yaml", lr=1e-3)
    b = write_job(tmp_path, "b.yaml", lr=3e-2)
    assert main(["train", a, "--compare", b]) == 1
    cap = capsys.readouterr()
    assert "FAIL b.yaml" in cap.out and "OVER" in cap.out and "FAIL: 1/2" in cap.out
    assert "veomni-ops train: FAIL: b.yaml" in cap.err
    assert main(["train", a, "--compare", b, "--loss-tol", "1"]) == 0  # a tolerance that admits it


def test_compare_json_carries_everything(tmp_path, in_process, capsys):
    a = write_job(tmp_path, "a.yaml", lr=1e-3)
    b = write_job(tmp_path, "b.yaml", lr=3e-2)
    assert main(["train", a, "--compare", b, "--json", "--steps", "4"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in out["runs"]] == ["a.yaml", "b.yaml"] and out["passed"] is False
    assert out["loss_tol"] == 1e-3 and "max(|loss of a.yaml|, 1)" in out["rule"]
    assert [c["passed"] for c in out["checks"]] == [True, False]
    run = out["runs"][0]
    assert len(run["losses"]) == len(run["step_tokens_per_s"]) == 4 and run["warmup_steps"] == 1
    assert {"tokens_per_s", "tokens_per_s_p25", "tokens_per_s_p75", "peak_gib", "plan"} <= set(run)
    assert out["speed_ratio_vs"]["b.yaml"][1] == 1.0
    assert out["compare"]["max_loss_diff"] > 0 and out["a"]["run"] == "a.yaml"  # the keys --compare always had


def test_nonfinite_loss_fails(tmp_path, in_process, capsys):
    a = write_job(tmp_path, "a.yaml")
    b = write_job(tmp_path, "huge-lr.yaml", lr=1e10)  # the weights blow up: NaN by step 3
    assert main(["train", a, "--compare", b, "--loss-tol", "1e9"]) == 1
    cap = capsys.readouterr()
    assert "FAIL huge-lr.yaml" in cap.out and "not finite" in cap.out and "not finite" in cap.err


def test_single_run_nonfinite_fails(tmp_path, capsys):
    assert main(["train", write_job(tmp_path, lr=1e10), "--json"]) == 1
    cap = capsys.readouterr()
    out = json.loads(cap.out)  # strict JSON: NaN is null
    assert out["passed"] is False and out["losses"][-1] is None and "not finite" in cap.err


# ----------------------------------------------------------------------------------------
# --steps, model.config_file, train.compile
# ----------------------------------------------------------------------------------------


def test_steps_overrides_train_steps(tmp_path, capsys):
    assert main(["train", write_job(tmp_path, steps=7), "--steps", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 2 and len(out["losses"]) == 2 and out["check"]["passed"]
    with pytest.raises(SystemExit):
        main(["train", write_job(tmp_path), "--steps", "0"])


def _tiny_config_json(path):
    fields = {**TINY, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 3,
              "layer_types": ["full_attention"] * 3}
    path.write_text(json.dumps(fields))
    return path


def test_model_config_file(tmp_path, capsys):
    cfg_dir = tmp_path / "ckpt"
    cfg_dir.mkdir()
    _tiny_config_json(cfg_dir / "config.json")
    # relative to the YAML's folder; overrides under model.config (layer_types follows num_hidden_layers)
    path = write_job(tmp_path, model={"config_file": "ckpt/config.json", "config": {"num_hidden_layers": 2}})
    job = train.load_job(path)
    assert job["architecture"] == "qwen3" and job["size"] is None
    model = train.build_model(job)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.num_hidden_layers == 2
    assert len(model.model.layers) == 2 and model.config.hidden_size == 32
    # the folder works too, and `config: PATH` is the short form
    short = write_job(tmp_path, "short.yaml", model={"config": str(cfg_dir)})
    assert train.build_model(train.load_job(short)).config.num_hidden_layers == 3
    assert main(["train", path, "--steps", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["architecture"] == "qwen3" and out["config_file"].endswith("config.json") and len(out["losses"]) == 2


@pytest.mark.parametrize(("model", "words"), [
    ({"config_file": "ckpt.json", "size": "tiny"}, "remove size"),
    ({"config_file": "ckpt.json", "architecture": "llama"}, "disagrees with model_type 'qwen3'"),
    ({"config_file": "missing.json"}, "does not exist"),
    ({"config_file": "nomodeltype.json"}, "has no 'model_type'"),
    ({"config": [1, 2]}, "must be a mapping"),
    ({"architecture": "gpt5"}, "config_file"),
])
def test_model_config_file_refusals(tmp_path, capsys, model, words):
    _tiny_config_json(tmp_path / "ckpt.json")
    (tmp_path / "nomodeltype.json").write_text(json.dumps(TINY))
    assert main(["train", write_job(tmp_path, model=model)]) == 1
    assert words in capsys.readouterr().err


def test_example_qwen3_30b_a3b_config_file():
    job = train.load_job(str(EXAMPLES / "qwen3-30b-a3b-4layers-auto.yaml"), here=False)  # a GPU job, read here
    cfg = train.build_config(job)
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok,
            cfg.moe_intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.vocab_size) == ("qwen3_moe", 4, 2048, 128, 8, 768, 32, 4, 128, 151936)
    assert cfg.output_router_logits and job["train"]["dtype"] == "bfloat16"


def test_compile_binds_for_compile_and_excludes_two_warmup_steps(tmp_path, monkeypatch):
    import torch

    compiled = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: compiled.append(m) or m)  # inductor on CPU is slow
    job = train.load_job(write_job(tmp_path, compile=True, steps=4))
    # No skip on TrainConfigError: train ships inside veomni_ops, whose apply has had compile=True since
    # before train.compile existed, so that error here means compile binding broke.
    res = train.train_one(job, out=io.StringIO())
    assert compiled and res["compiled"] and res["warmup_steps"] == 2 and res["timed_steps"] == [3, 4]
    assert res["plan"].get("compile") is True or res["plan"].get("mode") == "compile"
    base = train.train_one(job, out=io.StringIO(), baseline="transformers+compile")
    assert base["compiled"] and base["plan"] is None and len(compiled) == 2
    assert train.load_job(write_job(tmp_path, steps=4))["train"]["compile"] is False
    with pytest.raises(train.TrainConfigError, match="true or false"):
        train.load_job(write_job(tmp_path, compile="yes"))


def test_meta_init_in_one_process_trains_as_the_normal_build(tmp_path, monkeypatch):
    """``init_device: meta`` without a layout: built on meta, bound, materialised with the normal
    build's weights and buffers (rotary inv_freq included): the same losses, bit for bit."""
    import torch
    from veomni_ops.train import loop

    built = []
    real = loop._bind

    def spy(*a, **k):
        model, facts = real(*a, **k)
        built.append({n: b.clone() for n, b in model.named_buffers()})
        return model, facts

    monkeypatch.setattr(loop, "_bind", spy)
    out = io.StringIO()
    meta = train.train_one(train.load_job(write_job(tmp_path, "meta.yaml", init_device="meta")), out=out)
    normal = train.train_one(train.load_job(write_job(tmp_path)), out=io.StringIO())
    assert meta["init_device"] == "meta" and normal["init_device"] == "device"
    assert meta["losses"] == normal["losses"]
    assert "init: built on the meta device, bound, then materialised on cpu" in out.getvalue()
    assert set(built[0]) == set(built[1]) and any(n.endswith("inv_freq") for n in built[0])
    for n, b in built[1].items():
        assert torch.equal(built[0][n], b), n


# ----------------------------------------------------------------------------------------
# baselines and --plot
# ----------------------------------------------------------------------------------------


def test_baseline_transformers_in_child_processes(tmp_path, capsys):
    """The real thing: config, --compare and a baseline, each in its own process."""
    a = write_job(tmp_path, "auto.yaml", OPS_AUTO, steps=3)
    b = write_job(tmp_path, "eager.yaml", OPS_EAGER, steps=3)
    assert main(["train", a, "--compare", b, "--baseline", "transformers", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in out["runs"]] == ["auto.yaml", "eager.yaml", "transformers"]
    base = out["runs"][2]
    assert base["baseline"] == "transformers" and base["plan"] is None and base["bound"] is None
    assert base["losses"][0] == pytest.approx(out["runs"][0]["losses"][0], rel=1e-5)  # same model, seed and data
    assert out["passed"] and set(out["speed_ratio_vs"]) == {"eager.yaml", "transformers"}


def test_baseline_liger_refused_when_absent(tmp_path, monkeypatch, capsys):
    real = importlib.metadata.version

    def version(name):
        if name == "liger-kernel":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert main(["train", write_job(tmp_path), "--baseline", "liger"]) == 1
    assert "pip install liger-kernel" in capsys.readouterr().err


def test_baseline_liger_refused_on_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train.baselines, "liger_version", lambda: "0.8.5")
    assert main(["train", write_job(tmp_path), "--baseline", "liger"]) == 1
    assert "Triton GPU kernels" in capsys.readouterr().err


def test_baseline_unknown_name_is_usage_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["train", write_job(tmp_path), "--baseline", "megatron"])
    assert e.value.code == 2


def test_baseline_liger_runs_on_a_gpu(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or train.liger_version() is None:
        pytest.skip("Liger-Kernel's patch needs liger-kernel and a CUDA GPU")
    # child processes: Liger's patch replaces transformers' module-level classes for the whole process
    path = write_job(tmp_path, "gpu.yaml", OPS_AUTO, device="cuda", steps=3)
    assert main(["train", path, "--baseline", "liger", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    liger = out["runs"][1]
    assert liger["liger_patch"] == "apply_liger_kernel_to_qwen3" and out["passed"]


def test_plot_writes_a_png(tmp_path, in_process, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "runs.png"
    a = write_job(tmp_path, "a.yaml")
    assert main(["train", a, "--baseline", "transformers", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_names_the_fix(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["train", write_job(tmp_path), "--plot", str(tmp_path / "x.png")]) == 1
    assert "pip install matplotlib" in capsys.readouterr().err


def test_adamw_is_fused_on_cuda_for_every_run(monkeypatch):
    """Every run of a comparison (the job, each baseline, the FSDP2 peer) takes train.model.adamw:
    fused on CUDA (transformers' Trainer default), PyTorch's default elsewhere."""
    import torch
    from veomni_ops.train import model as M

    seen = []
    monkeypatch.setattr(torch.optim, "AdamW", lambda params, **kw: seen.append(kw) or kw)
    for device in ("cuda", "cuda:1", "cpu"):
        M.adamw([], 1e-3, device)
    assert seen == [{"lr": 1e-3, "fused": True}, {"lr": 1e-3, "fused": True}, {"lr": 1e-3, "fused": None}]
    from veomni_ops.train import loop, peers

    assert loop.adamw is M.adamw and peers.adamw is M.adamw
