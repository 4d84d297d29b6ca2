"""The job YAML of ``veomni-ops train``: every field is checked before anything is built, and
every mistake of a file comes in one error (issue 25)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from veomni_ops.cli import main  # noqa: E402
from veomni_ops.train import TrainConfigError, load_job, loop  # noqa: E402
from veomni_ops.train.job import device_problem  # noqa: E402

ELEVEN = Path(__file__).parent / "fixtures" / "jobs" / "eleven-mistakes.yaml"

GOOD = """\
model:
  architecture: qwen3
  size: tiny
  ops_implementation: {rms_norm_implementation: eager}
train: {batch_size: 2, seq_len: 8, steps: 1, lr: 1e-3, dtype: float32, device: cpu, seed: 0}
"""


@pytest.fixture
def nothing_built(monkeypatch):
    """A test that fails if a model is built."""
    monkeypatch.setattr(loop, "build_model", lambda *a, **k: pytest.fail("a model was built"))


def write(tmp_path, text, name="job.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_eleven_mistakes_are_one_run(capsys, nothing_built):
    assert main(["train", str(ELEVEN)]) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == f"veomni-ops train: {ELEVEN}: 11 problems in the job:"
    assert lines[1:] == [
        "  - unknown model field model.sise; did you mean model.size?",
        "  - model.ops_implementation: unknown ops_implementation field 'rms_norm_implmentation'; did you mean "
        "'rms_norm_implementation'?",
        "  - model.ops_implementation: moe_implementation must be a string kernel name, got int 3",
        "  - unknown train field train.step; did you mean train.steps?",
        "  - train.batch_size must be a whole number >= 1, got 0",
        "  - train.seq_len must be a whole number >= 2 (the loss predicts each next token: one token has none), "
        "got -3",
        "  - train.seed must be a whole number >= 0, got 'x'",
        "  - train.lr must be a number > 0 (e.g. 1.0e-3), got 'fast'",
        "  - train.dtype 'fp64' is not a dtype name here; write float64",
        "  - train.compile must be true or false, got 'yes please'",
        "  - train.device 'gpu': does not say which kind of GPU: write cuda (NVIDIA, and AMD under ROCm torch) or "
        "xpu (Intel), or auto",
    ]
    assert main(["train", str(ELEVEN), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "TrainConfigError" and len(data["problems"]) == 11


def test_a_good_job_loads_and_numbers_written_without_a_dot_are_numbers(tmp_path):
    job = load_job(write(tmp_path, GOOD))
    assert job["train"]["lr"] == 1e-3 and isinstance(job["train"]["lr"], float)  # YAML reads 1e-3 as a string


@pytest.mark.parametrize("text,problem", [
    ("modle:\n  architecture: qwen3\n", "unknown section modle; did you mean model?"),
    ("model: {architecture: qwen3}\ntrian: {steps: 1}\n", "unknown section trian; did you mean train?"),
    ("model: {architecture: qwen3, ops_implementaton: {rms_norm_implementation: eager}}\n",
     "unknown model field model.ops_implementaton; did you mean model.ops_implementation?"),
    ("model: {architecture: qwen3}\ntrain: {steps: 1}\ntrain: {steps: 2}\n",
     "key 'train' is given twice, on lines 2 and 3 (YAML would keep the second silently): keep one"),
    ("model: {architecture: qwen3}\ntrain: {dtype: float64, device: 'cuda:x'}\n",
     "train.device 'cuda:x': write auto, or a torch device: cpu, cuda, mps, xpu, npu, with an index for a GPU"),
    ("model: {architecture: qwen3}\ntrain: {device: 'cpu:1'}\n", "train.device 'cpu:1': cpu takes no index: write cpu"),
    ("model: {architecture: qwen3}\ntrain: {device: rocm}\n", "ROCm GPUs are cuda to torch: write cuda (or auto)"),
    ("model: {architecture: qwen3}\ntrain: {lr: .nan}\n", "train.lr must be a number > 0 (e.g. 1.0e-3), got nan"),
    ("model: {architecture: qwen3}\ntrain: {batch_size: 3}\nparallel: {dp_shard: 2}\n",
     "train.batch_size 3 is the global batch and parallel.dp_shard 2 must divide it"),
    ("model: {architecture: qwen3}\ntrain: {init_device: cuda}\n",
     "train.init_device must be one of: device, meta, got 'cuda' (the model is built on train.device unless it is "
     "meta)"),
    ("model: {architecture: qwen3}\ntrain: {compile_backend: ''}\n",
     "train.compile_backend '': write the name of a torch.compile backend"),
    ("model: {architecture: qwen3}\ntrain: {compile: true, compile_backend: aot_eagr}\n",
     "train.compile_backend 'aot_eagr': torch "),
])
def test_each_mistake_is_named(tmp_path, text, problem, nothing_built):
    with pytest.raises(TrainConfigError) as e:
        load_job(write(tmp_path, text))
    assert any(problem in p for p in e.value.problems), e.value.problems


def test_every_parallel_problem_comes_with_the_others(tmp_path, nothing_built):
    text = ("model: {architecture: qwen3, size: tiny}\ntrain: {batch_size: 4, device: cpu, compile: true}\n"
            "parallel: {dp_shard: 3, sp: 0, tp: 2, timeout_s: -1}\n")
    with pytest.raises(TrainConfigError) as e:
        load_job(write(tmp_path, text))
    problems = e.value.problems
    assert len(problems) == 4, problems
    assert problems[0].startswith("parallel: unknown field(s) tp; known: dp_shard")
    assert problems[1:4] == ("parallel.sp must be a whole number >= 1, got 0",
                             "parallel.timeout_s must be a number of seconds > 0, got -1",
                             "train.batch_size 4 is the global batch and parallel.dp_shard 3 must divide it (each "
                             "data-parallel rank trains batch_size / dp_shard rows)")
    # compile with a layout is a job like any other (issue 23)
    assert load_job(write(tmp_path, text.replace("dp_shard: 3, sp: 0, tp: 2, timeout_s: -1", "dp_shard: 2")))


def test_compile_backend_and_init_device(tmp_path, nothing_built):
    job = load_job(write(tmp_path, GOOD))["train"]
    assert job["compile_backend"] == "inductor" and job["init_device"] == "device"
    text = GOOD.replace("seed: 0}", "seed: 0, compile: true, compile_backend: aot_eager, init_device: meta}")
    job = load_job(write(tmp_path, text))["train"]
    assert job["compile_backend"] == "aot_eager" and job["init_device"] == "meta"
    # a backend this torch lacks is named with the closest one, only where it compiles and only here
    text = GOOD.replace("seed: 0}", "seed: 0, compile: true, compile_backend: aot_eagr, init_device: gpu}")
    with pytest.raises(TrainConfigError) as e:
        load_job(write(tmp_path, text))
    assert len(e.value.problems) == 2, e.value.problems
    assert "has no such compile backend; did you mean aot_eager?" in e.value.problems[0]
    assert e.value.problems[1] == "train.init_device must be one of: device, meta, got 'gpu'"
    assert load_job(write(tmp_path, text.replace("gpu", "meta")), here=False)["train"]["compile_backend"] == "aot_eagr"


def test_a_named_kernel_that_cannot_run_here_comes_with_the_other_mistakes(tmp_path, nothing_built):
    text = ("model: {architecture: qwen3, size: tiny, ops_implementation: {attn_implementation: flex_attention}}\n"
            "train: {device: cpu, stpes: 2}\n")
    with pytest.raises(TrainConfigError) as e:
        load_job(write(tmp_path, text))
    problems = e.value.problems
    assert problems[0] == "unknown train field train.stpes; did you mean train.steps?"
    assert len(problems) == 2 and problems[1].startswith(
        "model.ops_implementation: attn_implementation='flex_attention' (op attention, variant standard): kernel "
        "'flex_attention'") and "needs a cuda device" in problems[1], problems


def test_defaults_veomni_fills_what_the_job_omits_with_veomnis_kernels(tmp_path, capsys, nothing_built):
    from veomni_ops.veomni import VEOMNI_DEFAULTS

    path = write(tmp_path, GOOD)  # names rms_norm only
    ours = load_job(path)["ops"].to_dict()
    assert ours.pop("rms_norm_implementation") == "eager" and set(ours.values()) == {"auto"}
    job = load_job(path, here=False, defaults="veomni")
    assert job["ops"].to_dict() == {**VEOMNI_DEFAULTS, "rms_norm_implementation": "eager"}
    with pytest.raises(TrainConfigError, match="defaults must be one of 'auto', 'veomni', got 'gpu'"):
        load_job(path, defaults="gpu")
    # on this CPU VeOmni's (GPU) defaults cannot run: refused before anything is built, each named
    assert main(["train", path, "--defaults", "veomni", "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert any(p.startswith("model.ops_implementation: swiglu_mlp_implementation='liger_kernel'") for p in problems)
    assert not any("rms_norm_implementation" in p for p in problems)  # the job's own choice stands


def test_defaults_veomni_reaches_every_run_of_the_command(tmp_path, monkeypatch):
    from veomni_ops.train import command

    every = write(tmp_path, GOOD.replace("{rms_norm_implementation: eager}", "{rms_norm_implementation: eager, "
                                         "rotary_pos_emb_implementation: eager, swiglu_mlp_implementation: eager, "
                                         "cross_entropy_loss_implementation: eager, moe_implementation: eager, "
                                         "load_balancing_loss_implementation: eager, attn_implementation: sdpa}"))
    seen = []
    monkeypatch.setattr(command, "run_child", lambda path, *a, **k: seen.append((path, k)) or
                        {"name": path, "losses": [1.0], "tokens_per_s": 1.0, "dtype": "float32", "steps": 1})
    monkeypatch.setattr(command, "report", lambda runs, *a: {"passed": True, "checks": [{}] * len(runs), "rule": ""})
    monkeypatch.setattr(command, "print_report", lambda *a: None)
    assert main(["train", every, "--compare", every, "--defaults", "veomni"]) == 0
    assert [k["defaults"] for _, k in seen] == ["veomni", "veomni"]
    cmd = []
    monkeypatch.setattr(loop.subprocess, "run", lambda c, **k: cmd.append(c) or pytest.fail("stop"))
    with pytest.raises(pytest.fail.Exception):
        loop.run_child(every, 0, defaults="veomni")
    assert cmd[0][-2:] == ["--defaults", "veomni"]


def test_a_device_torch_does_not_see_here_is_refused_when_training_here(tmp_path, monkeypatch, nothing_built):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = write(tmp_path, GOOD.replace("device: cpu", "device: cuda"))
    with pytest.raises(TrainConfigError, match="train.device 'cuda': torch sees no cuda device on this machine; "
                                               "write device: cpu, or auto"):
        load_job(path)
    assert load_job(path, here=False)["train"]["device"] == "cuda"  # a GPU job, read on this machine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_problem("cuda:1") is None
    assert device_problem("cuda:2") == "torch sees 2 cuda device(s) here (indices 0..1)"


def test_the_job_refusal_and_resolve_device_agree_on_gpu():
    """'gpu' names no device type for planning (--device) nor for training (train.device)."""
    from veomni_ops import parse_device
    from veomni_ops.device import DeviceError

    with pytest.raises(DeviceError, match="does not say which kind of GPU"):
        parse_device("gpu")
    assert "does not say which kind of GPU" in device_problem("gpu")


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_example_job_passes_the_checks(path):
    """The shipped jobs pass every field check (here=False: the GPU ones are read on this CPU machine)."""
    load_job(str(path), here=False)
