"""``train.gradient_checkpointing`` (issue 35): the field is checked like the other train fields;
with it, every decoder layer keeps only its input and runs its forward again in the backward,
which changes no loss and no gradient (float32: bitwise, measured here) and keeps a layer's
activations out of memory. The same under ``parallel: {dp_shard: 2}``: test_parallel.py."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from veomni_ops.cli import main  # noqa: E402
from veomni_ops.parallel.fsdp import compile_layers  # noqa: E402
from veomni_ops.train import TrainConfigError, build_model, load_job, loop  # noqa: E402
from veomni_ops.train.data import job_batches  # noqa: E402
from veomni_ops.train.model import checkpoint_layers  # noqa: E402


def write(tmp_path, train: str, arch: str = "qwen3", name: str = "job.yaml") -> str:
    p = tmp_path / name
    p.write_text(f"model: {{architecture: {arch}, size: tiny}}\ntrain: {train}\n")
    return str(p)


@pytest.mark.parametrize("value, problem", [
    ("yes please", "train.gradient_checkpointing must be true or false, got 'yes please'"),
    ("1", "train.gradient_checkpointing must be true or false, got 1"),
    ("", "train.gradient_checkpointing has no value (YAML reads 'gradient_checkpointing:' with nothing after it as "
         "null): write a value, or remove the line (the default: false)"),
])
def test_the_field_is_a_bool_and_null_is_refused(tmp_path, value, problem):
    path = write(tmp_path, f"{{device: cpu, gradient_checkpointing: {value}}}")
    with pytest.raises(TrainConfigError) as e:
        load_job(path)
    assert list(e.value.problems) == [problem]
    assert load_job(write(tmp_path, "{device: cpu}", name="default.yaml"))["train"]["gradient_checkpointing"] is False
    assert load_job(write(tmp_path, "{device: cpu, gradient_checkpointing: true}", name="on.yaml"))[
        "train"]["gradient_checkpointing"] is True


def _one_step(path: str):
    """The job's model as the train command prepares it (bound; checkpointed where the job says),
    and its loss and gradients of one step."""
    job = load_job(path)
    model, facts = loop._prepare(job, None, "cpu", torch.float32, io.StringIO())
    model.train()
    batch = next(iter(job_batches({**job, "train": {**job["train"], "batch_size": 2, "seq_len": 24, "steps": 1,
                                                     "seed": 0}}, model.config.vocab_size, "cpu")))
    out = model(**loop.step_inputs(batch))  # the job's one-process call
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(out.loss.detach()), grads, facts


@pytest.mark.parametrize("arch, compile_", [("qwen3", False), ("qwen3_moe", False), ("qwen3", True)])
def test_losses_and_gradients_are_those_without_it_bitwise(tmp_path, arch, compile_):
    """float32 on the CPU: the recomputed forward runs the same kernels on the same inputs, so the
    loss and every gradient are bitwise those without checkpointing (measured: max |diff| 0).
    Compiled (aot_eager: the traced graphs run by the eager kernels), the checkpointed forward is
    what each decoder layer compiles."""
    extra = ", compile: true, compile_backend: aot_eager" if compile_ else ""
    loss0, grads0, facts0 = _one_step(write(tmp_path, f"{{device: cpu{extra}}}", arch, "off.yaml"))
    loss1, grads1, facts1 = _one_step(write(tmp_path, f"{{device: cpu, gradient_checkpointing: true{extra}}}",
                                            arch, "on.yaml"))
    assert facts0["gradient_checkpointing"] is False
    g = facts1["gradient_checkpointing"]
    assert g["layers"] == 2 and g["classes"] == [f"{'Qwen3Moe' if arch == 'qwen3_moe' else 'Qwen3'}DecoderLayer"]
    assert loss1 == loss0
    assert set(grads1) == set(grads0) and len(grads0) > 10
    for name, want in grads0.items():
        assert torch.equal(grads1[name], want), (name, float((grads1[name] - want).abs().max()))


def _saved_bytes(layers: int, checkpointed: bool, compiled: bool, batch: int = 2, seq: int = 32) -> int:
    """The bytes autograd keeps for the backward in one training forward of the tiny Qwen3 with
    ``layers`` layers: every tensor saved through ``saved_tensors_hooks`` (a storage once), but
    the parameters (saved for the weights' gradients, and held by the model anyway).
    Deterministic, unlike a CPU process's RSS. ``compiled``: each decoder layer compiled
    (aot_eager), after a first step that compiles it."""
    job = {"architecture": "qwen3", "size": "tiny", "config_file": None,
           "overrides": {"num_hidden_layers": layers}, "train": {"seed": 0}}
    model = build_model(job)
    model.train()
    if checkpointed:
        checkpoint_layers(model)
    ids = torch.arange(batch * seq).reshape(batch, seq)
    if compiled:
        compile_layers(model, "aot_eager")
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()  # the recomputation runs outside the hooks
    return sum(kept.values())


@pytest.mark.parametrize("compiled", [False, True])
def test_a_layers_activations_are_not_kept(compiled):
    """Two more layers add what those layers keep for the backward: without checkpointing all
    their activations, with it only their input, tokens x hidden x 4 bytes (2 x 32 x 128 x 4 =
    32 KiB). Measured at these shapes, a layer's bytes
    without -> with: eager 789,504 -> 32,768 (its input exactly), compiled 576,512 -> 37,824."""
    one_input = 2 * 32 * 128 * 4
    per_layer = {c: (_saved_bytes(4, c, compiled) - _saved_bytes(2, c, compiled)) / 2 for c in (False, True)}
    assert per_layer[True] <= 1.25 * one_input, per_layer
    assert per_layer[False] >= 10 * one_input, per_layer


def test_the_command_and_its_baseline_both_checkpoint(tmp_path, capsys):
    """A comparison stays like for like: the baseline of a job with gradient_checkpointing
    checkpoints too, each run's header says so, and the report."""
    path = write(tmp_path, "{batch_size: 2, seq_len: 16, steps: 2, device: cpu, gradient_checkpointing: true}")
    assert main(["train", path, "--baseline", "transformers"]) == 0
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert text.count("gradient checkpointing: 2 Qwen3DecoderLayer recomputed in the backward") == 2, text
    assert "baseline transformers: plain transformers" in text
    assert "gradient checkpointing (decoder layers recomputed in the backward): every run" in captured.out
