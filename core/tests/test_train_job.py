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
    ("model: {architecture: qwen3}\ntrain: {batch_size: 2}\nparallel: {dp_shard: 2, ep_chunks: 2}\n",
     "parallel.ep_chunks 2 chunks the expert-parallel exchange, which ep 1 does not have: set parallel.ep > 1 or "
     "drop ep_chunks"),
    ("model: {architecture: qwen3}\ntrain: {init_device: cuda}\n",
     "train.init_device must be one of: device, meta, got 'cuda' (the model is built on train.device unless it is "
     "meta)"),
    ("model: {architecture: qwen3}\ntrain: {compile_backend: ''}\n",
     "train.compile_backend '': write the name of a torch.compile backend"),
    ("model: {architecture: qwen3}\ntrain: {compile: true, compile_backend: aot_eagr}\n",
     "train.compile_backend 'aot_eagr': torch "),
    ("model: {architecture: qwen3}\ntrain: {compile: true, compile_mode: reduce_overhead}\n",
     "train.compile_mode 'reduce_overhead': did you mean reduce-overhead? write one of: default, reduce-overhead, "
     "max-autotune, max-autotune-no-cudagraphs"),
    ("model: {architecture: qwen3}\ntrain: {compile: true, compile_backend: aot_eager, compile_mode: reduce-overhead}\n",
     "train.compile_mode 'reduce-overhead': a mode is the inductor backend's; train.compile_backend is 'aot_eager': "
     "set it to inductor, or remove train.compile_mode"),
    ("model: {architecture: qwen3}\ntrain: {batch_size: 2, compile: true, compile_mode: reduce-overhead}\n"
     "parallel: {dp_shard: 2}\n",
     "train.compile_mode 'reduce-overhead' is for a job of one process; this layout has 2 ranks"),
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
    # ep_chunks (issue 36) is read and recorded in the layout like the other keys
    job = load_job(write(tmp_path, text.replace("dp_shard: 3, sp: 0, tp: 2, timeout_s: -1",
                                                 "dp_shard: 2, ep: 2, ep_chunks: 4")))
    assert job["parallel"].ep_chunks == 4 and job["parallel"].to_dict()["ep_chunks"] == 4


def test_every_data_problem_comes_with_the_others(tmp_path, nothing_built):
    """data: (packed documents, issue 35) is checked as train: is: every mistake in the one error,
    each named with its value and the fix."""
    text = ("model: {architecture: qwen3, size: tiny}\ntrain: {batch_size: 0, seq_len: 64, device: cpu}\n"
            "data: {packng: true, packing: yes, doc_len: {mean: 0, min: 1.5, sigmaa: 2, sigma: null, max: 'long'}}\n")
    with pytest.raises(TrainConfigError) as e:
        load_job(write(tmp_path, text))
    assert e.value.problems == (
        "train.batch_size must be a whole number >= 1, got 0",
        "unknown data field data.packng; did you mean data.packing?",
        "unknown data.doc_len field data.doc_len.sigmaa; did you mean data.doc_len.sigma?",
        "data.doc_len.sigma has no value (YAML reads 'sigma:' with nothing after it as null): write a value, or "
        "remove the line (the log-normal's shape: larger, a longer tail (default 1.0))",
        "data.doc_len.min must be a whole number of tokens >= 2 (a document's first token is not predicted: one "
        "token has nothing to learn), got 1.5",
        "data.doc_len.max must be a whole number of tokens >= 2, got 'long'",
        "data.doc_len.mean must be a number of tokens >= 1, got 0",
    )  # packing: yes is YAML's true
    text = "model: {architecture: qwen3}\ntrain: {seq_len: 64}\ndata: {packing: 'on', doc_len: [16, 512]}\n"
    with pytest.raises(TrainConfigError) as e:
        load_job(write(tmp_path, text))
    assert e.value.problems == ("data.packing must be true or false, got 'on'",
                                "data.doc_len must be a mapping of fields (mean, min, max, sigma), not list [16, 512]")


@pytest.mark.parametrize("data,problem", [
    ("dta: {packing: true}", "unknown section dta; did you mean data?"),
    ("data: [packing]", "data must be a mapping of fields (packing, doc_len), not list ['packing']"),
    ("data:", "data has no value (YAML reads 'data:' with nothing after it as null): write {packing: true} "
              "(documents packed into rows), or remove the line (unpacked rows)"),
    ("data: {packing: }", "data.packing has no value (YAML reads 'packing:' with nothing after it as null): write "
                          "true (documents packed into rows) or false"),
    ("data: {packing: true, doc_len: }", "data.doc_len has no value (YAML reads 'doc_len:' with nothing after it as "
                                         "null): write a mapping (mean, min, max, sigma), or remove the line (the "
                                         "defaults)"),
    ("data: {doc_len: {mean: 20}}", "data.doc_len sets the lengths of packed documents, and data.packing is false: "
                                    "set packing: true, or remove doc_len"),
    ("data: {packing: true, doc_len: {max: 100}}", "data.doc_len.max 100 is over train.seq_len 64: a document is at "
                                                   "most a row; lower max to 64 or less (or remove it: 64), or raise "
                                                   "train.seq_len"),
    ("data: {packing: true, doc_len: {min: 80}}", "data.doc_len.min 80 is over train.seq_len (doc_len.max by "
                                                  "default) 64: lower min, or raise train.seq_len"),
    ("data: {packing: true, doc_len: {min: 40, max: 32}}", "data.doc_len.min 40 is over data.doc_len.max 32: lower "
                                                           "min, or raise max"),
    ("data: {packing: true, doc_len: {mean: 8, min: 16}}", "data.doc_len.mean 8 is outside [min, max] = [16, 64]: "
                                                           "write a mean between them"),
    ("data: {packing: true, doc_len: {sigma: 9}}", "data.doc_len.sigma must be a number > 0 and <= 4 (the "
                                                   "log-normal's shape; 1.0: a long tail), got 9"),
])
def test_each_data_mistake_is_named_with_its_fix(tmp_path, data, problem, nothing_built):
    text = f"model: {{architecture: qwen3}}\ntrain: {{seq_len: 64}}\n{data}\n"
    with pytest.raises(TrainConfigError) as e:
        load_job(write(tmp_path, text))
    assert e.value.problems == (problem,)


def test_a_data_section_is_kept_and_without_one_nothing_changes(tmp_path, nothing_built):
    job = load_job(write(tmp_path, GOOD))
    assert job["data"] is None
    job = load_job(write(tmp_path, GOOD + "data: {packing: true, doc_len: {mean: 4, max: 8}}\n"))
    assert job["data"] == {"packing": True, "doc_len": {"mean": 4, "max": 8}}


def test_compile_backend_and_init_device(tmp_path, nothing_built):
    job = load_job(write(tmp_path, GOOD))["train"]
    assert job["compile_backend"] == "inductor" and job["init_device"] == "device"
    assert job["compile_mode"] == "default"
    text = GOOD.replace("seed: 0}", "seed: 0, compile: true, compile_mode: reduce-overhead}")
    assert load_job(write(tmp_path, text))["train"]["compile_mode"] == "reduce-overhead"
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
    from veomni_ops.veomni import NOT_IN_VEOMNI, VEOMNI_DEFAULTS

    path = write(tmp_path, GOOD)  # names rms_norm only
    ours = load_job(path)["ops"].to_dict()
    assert ours.pop("rms_norm_implementation") == "eager" and set(ours.values()) == {"auto"}
    job = load_job(path, here=False, defaults="veomni")
    assert job["ops"].to_dict() == {**VEOMNI_DEFAULTS, **dict.fromkeys(NOT_IN_VEOMNI, "auto"),
                                    "rms_norm_implementation": "eager"}
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
    """The shipped jobs pass every field check (here=False: the GPU ones are read on this CPU machine),
    and their steps' memory lower bound fits the 80 GB GPUs they were run on, far off (the 30B-shaped
    one-GPU job, whose out-of-memory is its point, needs 110 GB for AdamW: it is not refused)."""
    from veomni_ops.train.job import min_step_bytes

    job = load_job(str(path), here=False)
    assert min_step_bytes(job)[0] < 2 * 2**30


def test_a_job_file_or_config_file_that_is_not_utf8_is_named_with_the_byte(tmp_path, capsys, nothing_built):
    """Not a UnicodeDecodeError with no file named (issue 32): the file, the byte and its offset, the fix."""
    job = tmp_path / "job.yaml"
    job.write_bytes(GOOD.encode() + "# café\n".encode("latin-1"))
    assert main(["train", str(job), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "ConfigError" and data["error"] == (
        f"{job}: is not UTF-8 text: the byte 0xe9 at byte offset {len(GOOD) + 5} (line 6) cannot be decoded "
        "(invalid continuation byte); save the file as UTF-8")
    (tmp_path / "config.json").write_bytes('{"model_type": "qwen3", "name": "café"}'.encode("latin-1"))
    job.write_text("model: {config_file: config.json}\ntrain: {device: cpu}\n")
    with pytest.raises(TrainConfigError) as e:
        load_job(str(job))
    assert e.value.problems == (f"model.config_file: {tmp_path / 'config.json'} is not UTF-8 text: the byte 0xe9 at "
                                "byte offset 36 (line 1) cannot be decoded (invalid continuation byte); save the file "
                                "as UTF-8",)


def test_a_key_given_twice_in_flow_style_is_one_of_the_jobs_problems(tmp_path, nothing_built):
    path = write(tmp_path, GOOD.replace("steps: 1,", "steps: 1, steps: 2,"))
    with pytest.raises(TrainConfigError) as e:
        load_job(path)
    assert e.value.problems == (f"{path}:5: key 'steps' is given twice, on line 5 (columns 36 and 46) (YAML would "
                                "keep the second silently): keep one",)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_5"])
def test_a_misspelt_model_config_field_is_named_with_the_closest_field(tmp_path, arch, nothing_built):
    """A transformers config stores any key it is given, and no model reads a misspelt one (issue 32):
    each key of model.config is checked against the architecture's config class."""
    text = GOOD.replace("architecture: qwen3", f"architecture: {arch}").replace(
        "size: tiny", "size: tiny\n  config: {num_hiden_layers: 1, rope_theta: 5.0e+5, torch_dtype: float32, "
                      "attn_implementation: sdpa, hidden_size: 64, zzz: 1}")
    with pytest.raises(TrainConfigError) as e:
        load_job(write(tmp_path, text))
    import transformers

    cls = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "qwen3_moe": "Qwen3MoeConfig",
           "qwen3_5": "Qwen3_5TextConfig"}[arch]
    # the fields transformers itself converts (rope_theta, torch_dtype) or takes (attn_implementation) pass
    assert e.value.problems == (
        f"unknown model.config field 'num_hiden_layers': transformers {transformers.__version__}'s {cls} has no such "
        "field (it would be stored and read by nothing); did you mean model.config.num_hidden_layers?",
        f"unknown model.config field 'zzz': transformers {transformers.__version__}'s {cls} has no such field (it "
        "would be stored and read by nothing); remove it")


def test_a_key_the_model_code_reads_is_taken(tmp_path):
    """A key the config class does not declare but its model reads (``getattr(config, "head_dim",
    ...)``: transformers 5.24's Qwen3MoeConfig has no ``head_dim`` field, 5.17's has) is not
    refused as read by nothing: the model gets it."""
    text = GOOD.replace("architecture: qwen3", "architecture: qwen3_moe").replace(
        "size: tiny", "size: tiny\n  config: {head_dim: 24}")
    job = load_job(write(tmp_path, text))
    from veomni_ops.train.model import build_model

    model = build_model(job, "meta")
    assert model.model.layers[0].self_attn.head_dim == 24


def test_model_config_of_a_config_file_job_is_checked_against_its_model_type(tmp_path, nothing_built):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_hidden_layers": 2,
                                                      "my_own_note": "kept"}))
    path = write(tmp_path, "model:\n  config_file: config.json\n  config: {num_expert: 4, output_router_logits: true, "
                           "num_experts: 4, my_own_note: x}\ntrain: {device: cpu}\n")
    with pytest.raises(TrainConfigError) as e:
        load_job(path)
    # a key the file itself has may be overridden; num_experts is Qwen3MoeConfig's (its attribute_map)
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith("unknown model.config field 'num_expert': ")
    assert e.value.problems[0].endswith("Qwen3MoeConfig has no such field (it would be stored and read by nothing); "
                                        "did you mean model.config.num_experts?")


def test_train_without_transformers_names_the_models_extra(tmp_path, capsys, monkeypatch, nothing_built):
    """After `pip install veomni-ops[liger,triton]` (no transformers), train says what to install, as a
    refusal (one line, and JSON under --json), with the job's other mistakes (issue 32)."""
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # what `import transformers` is where it is missing
    path = write(tmp_path, GOOD.replace("seed: 0}", "seed: 0, stpes: 2}"))
    assert main(["train", path, "--json"]) == 1
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["kind"] == "TrainConfigError" and data["problems"][0] == (
        "the job's model is built with transformers, which cannot be imported here (import of transformers "
        'halted; None in sys.modules): pip install "veomni-ops[models]"')
    assert data["problems"][1] == "unknown train field train.stpes; did you mean train.steps?"
    assert err.startswith(f"veomni-ops train: {path}: 2 problems in the job:\n") and "Traceback" not in err


def test_a_field_with_no_value_is_named_with_the_fix_not_taken_as_its_default(tmp_path, nothing_built):
    """`field:` with nothing after it is YAML's null: in a job a value forgotten, not auto (issue 32).
    A section with nothing under it (config:, here) is empty, as before."""
    text = ("model:\n  architecture: qwen3\n  size:\n  config:\n  ops_implementation:\n    rms_norm_implementation:\n"
            "    moe_implementation:\ntrain:\n  device:\n  seq_len:\n  checkpoint_dir:\nlock:\n")
    with pytest.raises(TrainConfigError) as e:
        load_job(write(tmp_path, text))
    null = "has no value (YAML reads '{}:' with nothing after it as null): "
    ops_fix = "write auto (the best kernel usable here), eager or a kernel name, or remove the line (auto)"
    assert e.value.problems == (
        "model.size " + null.format("size") + "write one of: tiny, small, or remove the line (tiny)",
        "model.ops_implementation.rms_norm_implementation " + null.format("rms_norm_implementation") + ops_fix,
        "model.ops_implementation.moe_implementation " + null.format("moe_implementation") + ops_fix,
        "train.seq_len " + null.format("seq_len") + "write a value, or remove the line (the default: 128)",
        "train.device " + null.format("device") + "write auto, or a torch device (cpu, cuda), or remove the line "
                                                  "(auto)",
        "train.checkpoint_dir " + null.format("checkpoint_dir") + "write a value, or remove the line (the default: "
                                                                  "none)",
        "lock " + null.format("lock") + "write the path of a plan lock file, or remove the line (no lock)")


def test_an_ops_field_with_no_value_in_a_veomni_config_keeps_veomnis_meaning():
    """OpsConfig reads VeOmni's configs, where null is a value: attn_implementation's "no preference"
    (Optional in VeOmni's arguments: auto) and moe_implementation's old "no fused kernel" (eager).
    Only the job, veomni-ops' own format, refuses it."""
    from veomni_ops import OpsConfig

    cfg = OpsConfig.from_dict({"model": {"ops_implementation": {"attn_implementation": None,
                                                                 "moe_implementation": None}}})
    assert (cfg.attn_implementation, cfg.moe_implementation) == ("auto", "eager")


@pytest.mark.parametrize("train,wrong,device_known", [
    ("{device: cdua}", ["device"], False),
    ("{device: cpu, dtype: fp8}", ["dtype"], True),
    ("{device: cpu, compile: maybe}", ["compile"], True),
    ("{device: gpu, dtype: int4, compile: 2}", ["device", "dtype", "compile"], False),
])
@pytest.mark.filterwarnings("ignore:moe_implementation. 'fused' is a legacy VeOmni value")
def test_a_device_or_dtype_mistake_hides_no_kernel_name_typo(tmp_path, train, wrong, device_known, nothing_built):
    """Every mistake in one error (issue 32): where or how it trains being wrong, the kernel names are
    still checked; without a device, for what needs none (a GPU-only kernel, or a VeOmni value whose
    kernel depends on the device, is not refused then)."""
    text = ("model: {architecture: qwen3, size: tiny, ops_implementation: {rms_norm_implementation: eagr, "
            f"attn_implementation: flash_attention_4, moe_implementation: fused}}}}\ntrain: {train}\n")
    with pytest.raises(TrainConfigError) as e:
        load_job(write(tmp_path, text))
    problems = e.value.problems
    assert sorted(p.partition(" ")[0] for p in problems[:len(wrong)]) == sorted(f"train.{k}" for k in wrong), problems
    kernels = problems[len(wrong):]
    assert kernels[0].startswith(
        "model.ops_implementation: rms_norm_implementation='eagr' (op rms_norm, variant standard): no kernel 'eagr' is "
        "registered for rms_norm (did you mean 'eager'?)"), problems
    assert sorted(p.split("=")[0] for p in kernels[1:]) == (
        ["model.ops_implementation: attn_implementation", "model.ops_implementation: moe_implementation"]
        if device_known else []), problems


def test_a_step_that_cannot_fit_is_refused_before_anything_is_built(tmp_path, monkeypatch, nothing_built):
    """seq_len: 100000000000 failed at allocation (issue 32): the step's memory lower bound (each
    layer's input kept for the backward, and the embedding) is checked against the device's memory
    here, and against any machine's wherever the job is read."""
    from veomni_ops.parallel import fsdp

    path = write(tmp_path, GOOD.replace("seq_len: 8", "seq_len: 100000000000"))
    with pytest.raises(TrainConfigError) as e:
        load_job(path)
    (problem,) = e.value.problems
    assert problem.startswith("train.seq_len 100,000,000,000 and batch_size 2: one training step needs at least "
                              "190,734.9 GiB on each rank (each layer's input kept for the backward, "
                              "200,000,000,000 tokens x hidden 128 x 2 layers x 4 bytes, and the embedding, vocab "
                              "2,048 x hidden 128), more than this machine's memory (")
    assert problem.endswith(" GiB): lower seq_len or batch_size, or split the batch over more ranks "
                            "(parallel.dp_shard, parallel.sp)")
    with pytest.raises(TrainConfigError, match=r"more than any one machine has \(65,536.0 GiB\)"):
        load_job(path, here=False)  # a job for another machine: no machine has that
    # against the device's memory: 1 GiB here refuses what fits 80 GiB; split over ranks it fits
    text = GOOD.replace("size: tiny", "size: small").replace("seq_len: 8", "seq_len: 65536")
    monkeypatch.setattr(fsdp, "device_memory_bytes", lambda device: 2**30)
    with pytest.raises(TrainConfigError, match=r"needs at least 4.6 GiB on each rank .*more than this machine's "
                                               r"memory \(1.0 GiB\)"):
        load_job(write(tmp_path, text))
    assert load_job(write(tmp_path, text), here=False)
    monkeypatch.setattr(fsdp, "device_memory_bytes", lambda device: 80 * 2**30)
    assert load_job(write(tmp_path, text))
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    text = text.replace("device: cpu", "device: 'cuda:1'").replace("seq_len: 65536", "seq_len: 2097152")
    with pytest.raises(TrainConfigError, match=r"more than the memory of cuda:1 here \(80.0 GiB\)"):
        load_job(write(tmp_path, text))
    assert load_job(write(tmp_path, text + "parallel: {dp_shard: 2}\n"))
