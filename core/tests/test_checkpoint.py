"""Checkpoints of ``veomni-ops train`` (issue 23, "nothing lost"; :mod:`veomni_ops.train.checkpoint`).

A run killed hard (``os._exit(9)``: no cleanup, as under SIGKILL; ``ckpt_worker.py``) and
resumed gives the losses of a run never stopped, bitwise in float32: in one process (written
at 1 thread and resumed in a process of 2, and the reverse: the resumed run takes the
checkpoint's thread count), and on 2 processes (``dp_shard: 2``, gloo; killed in the middle of a save, whose half-written checkpoint
resume must pass over). A checkpoint written under ``dp_shard: 2`` (and ``dp_shard: 2, ep: 2``)
resumes in one process, and one written in one process under ``sp: 2, ep: 2``. And
the refusals: malformed fields, no checkpoint, a checkpoint of another model or other data.
The 2-process jobs are marked ``parallel``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
yaml = pytest.importorskip("yaml")

import test_parallel as P  # noqa: E402
from veomni_ops.cli import main  # noqa: E402
from veomni_ops.train import TrainConfigError, load_job, loop, train_one  # noqa: E402
from veomni_ops.train.checkpoint import (  # noqa: E402
    DCP_METADATA,
    INFO,
    checkpoint_name,
    complete_checkpoints,
    find_resume,
)

HERE = Path(__file__).resolve().parent
WORKER = HERE / "ckpt_worker.py"
STEPS = 6
TRAIN = {"batch_size": 2, "seq_len": 16, "steps": STEPS, "lr": 1e-3, "dtype": "float32", "device": "cpu", "seed": 0}
#: A checkpoint written under dp_shard 2, resumed in one process: the gradients are summed in
#: another order (FSDP's reduce-scatter adds the two ranks' shares of the loss; one process sums
#: the whole batch at once), so the losses differ by float32 rounding. Measured: 1.3e-7 relative
#: at step 6 (2 ulp at 7.6), which is also what one process and dp_shard 2 differ by from step 0.
#: 1e-6 allows for other CPUs' summation orders and still fails on any real loss of state: a
#: fresh AdamW (no moments), or the data from the wrong step, moves steps 5 and 6 by >1e-4.
CROSS_LAYOUT_TOL = 1e-6
MOE = {"architecture": "qwen3_moe"}


def write_job(tmp_path: Path, name: str, parallel: dict | None = None, model: dict | None = None,
              **train) -> Path:
    job = {"model": {"architecture": "qwen3", "size": "tiny", **(model or {})}, "train": {**TRAIN, **train}}
    if parallel is not None:
        job["parallel"] = {**parallel, "timeout_s": 60}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def quiet():
    return open(os.devnull, "w")


def steps_in(directory: Path) -> list[str]:
    """The checkpoints (and interrupted saves) in ``directory``: not rank 0's progress note (.restart)."""
    from veomni_ops.train.restart import PROGRESS

    return sorted(n for n in os.listdir(directory) if n != PROGRESS)


@contextlib.contextmanager
def threads(n: int):
    """torch at ``n`` intra-op threads in this process, whatever the machine and OMP_NUM_THREADS."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def one_process(tmp_path: Path, result: Path, kill: str, *args: str, threads: int = 1) -> subprocess.CompletedProcess:
    """``veomni-ops train ARGS`` in a process of its own (not a rank: no torchrun variables), at
    ``threads`` intra-op threads (OMP_NUM_THREADS)."""
    env = {**P._env(), "OMP_NUM_THREADS": str(threads)}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return subprocess.run([sys.executable, str(WORKER), str(result), kill, "--", *args], env=env, cwd=str(HERE),
                          capture_output=True, text=True, timeout=P.JOB_TIMEOUT_S)


def two_ranks(tmp_path: Path, result: Path, kill: str, *args: str) -> list[dict]:
    logs = tmp_path / result.stem
    logs.mkdir()
    return P.launch(2, [str(WORKER), str(result), kill, "--", *args], logs)


# ----------------------------------------------------------------------------------------
# one process
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("written, here", [(1, 2), (2, 1)], ids=["1-thread-resumed-in-2", "2-threads-resumed-in-1"])
def test_one_process_killed_and_resumed_gives_the_same_losses(tmp_path, capsys, written, here):
    """Killed in a process at ``written`` threads, resumed in one at ``here``: the resumed run
    takes the checkpoint's count (torch's float32 sums split over threads round otherwise: on
    some CPUs 1 and 2 threads give first-step gradients 1.6e-7 apart), and this process's count
    is its own again after it."""
    with threads(written):
        never = train_one(load_job(str(write_job(tmp_path, "plain"))), out=quiet())
        saved = train_one(load_job(str(write_job(tmp_path, "saved", checkpoint_dir="a", checkpoint_every=2))),
                          out=quiet())
    assert never["threads"] == written
    never = never["losses"]
    assert saved["losses"] == never and len(never) == STEPS  # writing checkpoints changes nothing
    assert steps_in(tmp_path / "a") == [checkpoint_name(s) for s in (2, 4, 6)]

    job = write_job(tmp_path, "killed", checkpoint_dir="b", checkpoint_every=2)
    proc = one_process(tmp_path, tmp_path / "killed.json", "after:4", str(job), threads=written)
    assert proc.returncode == 9, proc.stderr[-4000:]
    assert "step   4/6" in proc.stderr and "step   5/6" not in proc.stderr
    assert steps_in(tmp_path / "b") == [checkpoint_name(2), checkpoint_name(4)]
    assert json.loads((tmp_path / "b" / checkpoint_name(4) / INFO).read_text())["threads"] == written

    with threads(here):
        assert main(["train", str(job), "--resume", "--json"]) == 0
        assert torch.get_num_threads() == here  # the run's count was the run's only
    out = capsys.readouterr()
    got = json.loads(out.out)
    assert got["resumed_from"] == str(tmp_path / "b" / checkpoint_name(4)) and got["first_step"] == 5
    assert got["threads"] == written
    assert got["losses"] == never, (got["losses"], never)  # steps 1..4 from the checkpoint, 5..6 trained: bitwise
    assert (f"threads: {written} intra-op thread(s), the count {tmp_path / 'b' / checkpoint_name(4)} was written at, "
            f"for the losses of a run never stopped (torch's count in this process is {here}; train.threads sets "
            "another)") in out.err
    assert "resumed: step 4 <- " in out.err and "step   5/6" in out.err and "step   4/6" not in out.err
    assert "differ by rounding" not in out.err and "warning" not in out.err
    assert steps_in(tmp_path / "b") == [checkpoint_name(s) for s in (2, 4, 6)]
    info = json.loads((tmp_path / "b" / checkpoint_name(6) / INFO).read_text())
    assert info["step"] == 6 and info["losses"] == never and info["world_size"] == 1 and info["threads"] == written


def test_resuming_at_another_thread_count_is_said(tmp_path, capsys, two_steps):
    """``train.threads`` set to another count than the checkpoint's: the run takes it, and says
    that its losses are not bitwise those of a run never stopped."""
    written = json.loads((two_steps / INFO).read_text())["threads"]
    job = write_job(tmp_path, "other", steps=3, threads=written + 1, resume=str(two_steps))
    assert main(["train", str(job), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["threads"] == written + 1
    assert (f"at {written + 1} intra-op thread(s), written at {written} (train.threads): the losses differ by rounding "
            "from a run never stopped") in out.err


# ----------------------------------------------------------------------------------------
# two processes (dp_shard 2, gloo), and dp_shard 2 -> one process
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dp2_never_stopped(tmp_path_factory):
    """dp_shard 2, 6 steps, a checkpoint every 2, never stopped: (losses, checkpoint_dir)."""
    tmp = tmp_path_factory.mktemp("dp2")
    job = write_job(tmp, "dp2", parallel={"dp_shard": 2}, checkpoint_dir="ck", checkpoint_every=2)
    res = two_ranks(tmp, tmp / "never.json", "none", str(job))
    assert all(r["rc"] == 0 for r in res), P._fmt(res)
    got = json.loads((tmp / "never.json").read_text())
    assert got["parallel"]["dp_shard"] == 2 and len(got["losses"]) == STEPS
    return got["losses"], tmp / "ck"


@pytest.mark.parallel
def test_two_processes_killed_mid_save_and_resumed_give_the_same_losses(tmp_path, dp2_never_stopped):
    never, _ = dp2_never_stopped
    job = write_job(tmp_path, "dp2", parallel={"dp_shard": 2}, checkpoint_dir="ck", checkpoint_every=2)
    # rank 0 dies in the save of step 6, its data and DCP's metadata written, before it is committed
    res = two_ranks(tmp_path, tmp_path / "killed.json", "during:6", str(job))
    assert res[0]["rc"] == 9 and res[1]["rc"] not in (0, None), P._fmt(res)  # rank 1 ended too, none hung
    assert steps_in(tmp_path / "ck") == [checkpoint_name(2), checkpoint_name(4), checkpoint_name(6) + ".partial"]
    assert (tmp_path / "ck" / (checkpoint_name(6) + ".partial") / DCP_METADATA).is_file()

    res = two_ranks(tmp_path, tmp_path / "resumed.json", "none", str(job), "--resume")
    assert all(r["rc"] == 0 for r in res), P._fmt(res)
    got = json.loads((tmp_path / "resumed.json").read_text())
    assert got["resumed_from"] == str(tmp_path / "ck" / checkpoint_name(4)), got["resumed_from"]  # not the half 6
    assert got["losses"] == never, (got["losses"], never)  # bitwise
    assert "resumed: step 4 <- " in res[0]["output"], P._fmt(res)
    assert steps_in(tmp_path / "ck") == [checkpoint_name(s) for s in (2, 4, 6)]  # the half save replaced


@pytest.mark.parallel
def test_a_dp2_checkpoint_resumes_in_one_process(tmp_path, dp2_never_stopped):
    never, ck = dp2_never_stopped
    job = load_job(str(write_job(tmp_path, "one", resume=str(ck / checkpoint_name(4)))))
    got = train_one(job, out=quiet())
    assert got["first_step"] == 5 and got["losses"][:4] == never[:4]
    for a, b in zip(got["losses"][4:], never[4:], strict=True):
        assert abs(a - b) <= CROSS_LAYOUT_TOL * abs(b), (got["losses"], never)


@pytest.fixture(scope="module")
def moe_two_steps(tmp_path_factory):
    """A checkpoint of the tiny Qwen3-MoE after 2 steps (one process)."""
    tmp = tmp_path_factory.mktemp("moe_two_steps")
    train_one(load_job(str(write_job(tmp, "two", model=MOE, steps=2, checkpoint_dir="ck"))), out=quiet())
    return tmp / "ck" / checkpoint_name(2)


@pytest.mark.parallel
def test_a_one_process_checkpoint_resumes_under_sp2_ep2(tmp_path, moe_two_steps):
    """The reverse way, another layout, and experts: one process -> sp 2 x ep 2 (FSDP2 shards of
    every dense parameter; each rank reads its 4 of the 8 experts; rank 1, which the checkpoint
    has no RNG state for, takes rank 0's)."""
    never = train_one(load_job(str(write_job(tmp_path, "never", model=MOE, steps=4))), out=quiet())["losses"]
    job = write_job(tmp_path, "sp2ep2", parallel={"sp": 2, "ep": 2}, model=MOE, steps=4, resume=str(moe_two_steps))
    res = two_ranks(tmp_path, tmp_path / "sp2ep2.json", "none", str(job))
    assert all(r["rc"] == 0 for r in res), P._fmt(res)
    got = json.loads((tmp_path / "sp2ep2.json").read_text())
    assert got["parallel"]["ep"] == 2 and got["first_step"] == 3 and got["losses"][:2] == never[:2]
    for a, b in zip(got["losses"][2:], never[2:], strict=True):
        assert abs(a - b) <= CROSS_LAYOUT_TOL * abs(b), (got["losses"], never)


@pytest.mark.parallel
def test_an_expert_parallel_checkpoint_resumes_in_one_process(tmp_path):
    """dp_shard 2 x ep 2 writes each rank's experts as its part of all 8 (ranks 0 and 1 own
    experts 0-3 and 4-7); one process reads them whole and goes on as the run did."""
    job = write_job(tmp_path, "ep2", parallel={"dp_shard": 2, "ep": 2}, model=MOE, steps=4, checkpoint_dir="ck",
                     checkpoint_every=2)
    res = two_ranks(tmp_path, tmp_path / "ep2.json", "none", str(job))
    assert all(r["rc"] == 0 for r in res), P._fmt(res)
    never = json.loads((tmp_path / "ep2.json").read_text())["losses"]
    ck = tmp_path / "ck" / checkpoint_name(2)
    import torch.distributed.checkpoint as dcp

    meta = dcp.FileSystemReader(str(ck)).read_metadata().state_dict_metadata
    experts = meta["model.model.layers.0.mlp.experts.gate_up_proj"]
    assert tuple(experts.size)[0] == 8 and sorted(tuple(c.offsets)[0] for c in experts.chunks) == [0, 4]
    got = train_one(load_job(str(write_job(tmp_path, "one", model=MOE, steps=4, resume=str(ck)))), out=quiet())
    assert got["losses"][:2] == never[:2]
    for a, b in zip(got["losses"][2:], never[2:], strict=True):
        assert abs(a - b) <= CROSS_LAYOUT_TOL * abs(b), (got["losses"], never)


# ----------------------------------------------------------------------------------------
# refusals
# ----------------------------------------------------------------------------------------


@pytest.fixture
def nothing_built(monkeypatch):
    monkeypatch.setattr(loop, "build_model", lambda *a, **k: pytest.fail("a model was built"))


def test_malformed_checkpoint_fields_are_reported_together(tmp_path, nothing_built):
    (tmp_path / "afile").write_text("")
    path = write_job(tmp_path, "bad", checkpoint_dir="afile", checkpoint_every=-1, resume=3)
    with pytest.raises(TrainConfigError) as e:
        load_job(str(path))
    assert e.value.problems == (
        f"train.checkpoint_dir {tmp_path / 'afile'} is a file, not a folder: name a folder (it is made where it is "
        "missing)",
        "train.checkpoint_every must be a whole number of steps >= 0 (0: a checkpoint at the last step only), got -1",
        "train.resume must be true (the latest checkpoint in checkpoint_dir), auto (the same, or a fresh start where "
        "there is none), false, or the path of a checkpoint; got 3",
    )
    path = write_job(tmp_path, "notadir", checkpoint_dir=5, checkpoint_every=2, resume=True)
    with pytest.raises(TrainConfigError) as e:
        load_job(str(path))
    assert e.value.problems == ("train.checkpoint_dir must be the path of a folder to write checkpoints into, not 5",)
    path = write_job(tmp_path, "nodir", checkpoint_every=2, resume=True)
    with pytest.raises(TrainConfigError) as e:
        load_job(str(path))
    assert e.value.problems == (
        "train.checkpoint_every needs train.checkpoint_dir: the folder to write the checkpoints into",
        "train.resume: true resumes from the latest checkpoint in train.checkpoint_dir, which is not set: set "
        "checkpoint_dir, or give resume: PATH of a checkpoint",
    )


def test_resume_with_no_checkpoint_says_so(tmp_path, capsys, nothing_built):
    (tmp_path / "ck" / (checkpoint_name(2) + ".partial")).mkdir(parents=True)
    path = write_job(tmp_path, "job", checkpoint_dir="ck", resume=True)
    with pytest.raises(TrainConfigError) as e:
        load_job(str(path))
    assert str(e.value) == (
        f"{path}: train.resume: true, but {tmp_path / 'ck'} holds no complete checkpoint (a step-N folder with "
        f".metadata and veomni_ops.json); {checkpoint_name(2)}.partial is an interrupted save, never resumed from: "
        "train without resume to write the first (resume: auto resumes where there is one and starts from step 0 "
        "where there is none), or point resume: at a checkpoint")
    # the same from the command line, without the field
    plain = write_job(tmp_path, "plain")
    assert main(["train", str(plain), "--resume"]) == 1
    assert "train.resume: true resumes from the latest checkpoint in train.checkpoint_dir, which is not set" \
        in capsys.readouterr().err
    assert main(["train", str(plain), "--resume", str(tmp_path / "nowhere")]) == 1
    assert f"train.resume: {tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err
    # auto: nothing to resume is a fresh start
    assert find_resume(load_job(str(write_job(tmp_path, "auto", checkpoint_dir="ck", resume="auto")))["train"]) is None


def test_resume_picks_the_latest_complete_checkpoint(tmp_path):
    ck = tmp_path / "ck"

    def fake(name: str, *files: str) -> Path:
        (ck / name).mkdir(parents=True)
        for f in files:
            (ck / name / f).write_text("{}")
        return ck / name

    fake(checkpoint_name(2), DCP_METADATA, INFO)
    four = fake(checkpoint_name(4), DCP_METADATA, INFO)
    fake(checkpoint_name(6) + ".partial", DCP_METADATA, INFO)  # killed before its rename
    fake(checkpoint_name(8), DCP_METADATA)  # no veomni_ops.json: not ours, or damaged
    fake("step-10", DCP_METADATA, INFO)  # not a name we write
    assert [s for s, _ in complete_checkpoints(str(ck))] == [2, 4]
    train = {"checkpoint_dir": str(ck), "resume": True}
    assert find_resume(train) == str(four)
    assert find_resume({"resume": str(ck)}) == str(four)  # a folder of checkpoints: its latest
    assert find_resume({"resume": str(ck / checkpoint_name(2))}) == str(ck / checkpoint_name(2))
    for half in (checkpoint_name(6) + ".partial", checkpoint_name(8)):
        with pytest.raises(TrainConfigError, match="is an incomplete checkpoint"):
            find_resume({"resume": str(ck / half)})


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A checkpoint of the tiny Qwen3 after 2 steps (one process)."""
    tmp = tmp_path_factory.mktemp("two_steps")
    train_one(load_job(str(write_job(tmp, "two", steps=2, checkpoint_dir="ck"))), out=quiet())
    return tmp / "ck" / checkpoint_name(2)


def test_a_checkpoint_of_another_model_is_refused(tmp_path, two_steps):
    job = load_job(str(write_job(tmp_path, "wider", model={"config": {"hidden_size": 64}}, resume=str(two_steps))))
    with pytest.raises(TrainConfigError) as e:
        train_one(job, out=quiet())
    msg = str(e.value)
    assert msg.startswith(f"{two_steps}: the checkpoint is of another model (written by qwen3 tiny): parameters "
                          "of other shapes: model.embed_tokens.weight [2048, 128] there, [2048, 64] here, "), msg
    assert msg.endswith("Resume with the model it was written for, or train this one into a fresh checkpoint_dir")
    job = load_job(str(write_job(tmp_path, "deeper", model={"config": {"num_hidden_layers": 3}},
                                 resume=str(two_steps))))
    with pytest.raises(TrainConfigError, match=r"parameters not in the checkpoint: model\.layers\.2\."):
        train_one(job, out=quiet())


def test_a_checkpoint_of_other_data_or_no_steps_left_is_refused(tmp_path, two_steps):
    job = load_job(str(write_job(tmp_path, "batch4", batch_size=4, seed=1, resume=str(two_steps))))
    with pytest.raises(TrainConfigError) as e:
        train_one(job, out=quiet())
    assert str(e.value) == (
        f"{two_steps}: the checkpoint's data differ from this job's (seed 0 there, 1 here; batch_size 2 there, 4 "
        "here): the synthetic batches, and so where the data stands, depend on train.seed, batch_size, seq_len, the "
        "vocabulary and the packing (data.packing, doc_len; None: unpacked); resume with the values it was written "
        "with, or write a fresh checkpoint_dir")
    job = load_job(str(write_job(tmp_path, "done", steps=2, resume=str(two_steps))))
    with pytest.raises(TrainConfigError, match="the checkpoint is at step 2 and train.steps is 2: nothing is left to "
                                               r"train; raise train.steps \(or --steps\) to train on"):
        train_one(job, out=quiet())


def test_a_packed_job_resumes_on_its_documents_and_other_data_is_refused(tmp_path, two_steps):
    """Packed documents (``data:``, issue 35) are a function of the seed and the step: a resumed
    run trains on the documents of the run never stopped, bitwise; a checkpoint of packed rows and
    a job of unpacked ones (or other document lengths) are other data, refused."""
    def packed(name: str, **train) -> Path:
        path = write_job(tmp_path, name, **train)
        job = yaml.safe_load(path.read_text())
        job["data"] = {"packing": True, "doc_len": {"mean": 5, "min": 2}}
        path.write_text(yaml.safe_dump(job))
        return path

    with threads(1):
        whole = train_one(load_job(str(packed("whole", steps=4, checkpoint_dir="ck", checkpoint_every=2))),
                          out=quiet())
        info = json.loads((tmp_path / "ck" / checkpoint_name(2) / INFO).read_text())
        assert info["data"]["packing"] == {"mean": 5, "min": 2, "max": 16, "sigma": 1.0}
        said = io.StringIO()
        resumed = train_one(load_job(str(packed("again", steps=4, resume=str(tmp_path / "ck" / checkpoint_name(2))))),
                            out=said)
    assert resumed["first_step"] == 3 and resumed["losses"] == whole["losses"]  # bitwise
    assert "data: packed documents, lengths log-normal (mean 5, sigma 1.0) clipped to [2, 16]" in said.getvalue()
    assert "; step 3: " in said.getvalue()  # the resumed run's first step, counted
    assert resumed["data"]["rows"] == 4 and whole["data"]["rows"] == 8
    job = load_job(str(write_job(tmp_path, "unpacked", steps=4, resume=str(tmp_path / "ck" / checkpoint_name(2)))))
    with pytest.raises(TrainConfigError, match=r"data differ from this job's \(packing \{'mean': 5, 'min': 2, 'max': "
                                               r"16, 'sigma': 1.0\} there, None here\)"):
        train_one(job, out=quiet())
    job = load_job(str(packed("packed", steps=4, resume=str(two_steps))))
    with pytest.raises(TrainConfigError, match=r"data differ from this job's \(packing None there, \{'mean': 5"):
        train_one(job, out=quiet())
