"""Checkpoints of ``veomni-ops train`` against a bad disk, a bad file and another model (issue 32;
:mod:`veomni_ops.train.checkpoint`).

A ``checkpoint_dir`` that cannot be written is refused when the job is read, not at its first
save. A save or a read that fails (DCP's ``CheckpointException``, a ``BaseException``) is a
``CheckpointError``: one line, and ``{"error", "kind"}`` under ``--json``. Every file of a
checkpoint is kept with its size and sha256, and checked before it is read: a missing, truncated
or bit-flipped file is refused, naming it (a checkpoint of an earlier veomni-ops, without them,
is read with a warning). The model's whole config is kept, and a resume under another one is
refused naming each field; another plan is said, not refused. One process, tiny models.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_checkpoint import quiet, write_job  # noqa: E402
from veomni_ops.cli import main  # noqa: E402
from veomni_ops.train import TrainConfigError, load_job, loop, train_one  # noqa: E402
from veomni_ops.train.checkpoint import INFO, checkpoint_name  # noqa: E402

SHARD = "__0_0.distcp"  # DCP's file of rank 0's data (one process: every tensor)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """The checkpoints of steps 1 and 2 of the tiny Qwen3 (one process): never changed; each
    test damages a copy."""
    tmp = tmp_path_factory.mktemp("written")
    train_one(load_job(str(write_job(tmp, "two", steps=2, checkpoint_dir="ck", checkpoint_every=1))), out=quiet())
    return tmp / "ck"


@pytest.fixture
def ck(tmp_path, written) -> Path:
    """A copy of ``written`` to damage: resume the job in ``tmp_path`` (3 steps) from it."""
    shutil.copytree(written, tmp_path / "ck")
    return tmp_path / "ck"


def resume(tmp_path: Path, capsys, *args: str, **job) -> tuple[int, dict, str]:
    """``veomni-ops train JOB --resume --json`` (3 steps, from ``tmp_path/ck``): (exit, JSON, stderr)."""
    path = write_job(tmp_path, "resume", steps=3, checkpoint_dir="ck", **job)
    rc = main(["train", str(path), "--resume", *args, "--json"])
    out = capsys.readouterr()
    return rc, json.loads(out.out), out.err


# ----------------------------------------------------------------------------------------
# a checkpoint_dir that cannot be written: refused before step 1
# ----------------------------------------------------------------------------------------


def test_a_checkpoint_dir_that_cannot_be_written_is_refused_before_step_1(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loop, "build_model", lambda *a, **k: pytest.fail("a model was built"))
    (tmp_path / "afile").write_text("")
    folder = tmp_path / "afile" / "ck"  # its parent is a file: it cannot be made, whoever runs the test (root too)
    path = write_job(tmp_path, "job", checkpoint_dir="afile/ck", checkpoint_every=2)
    with pytest.raises(TrainConfigError) as e:
        load_job(str(path))
    assert e.value.problems == (
        f"train.checkpoint_dir {folder} cannot be written (NotADirectoryError: Not a directory: {folder}): the "
        "checkpoints would be lost at the first save; make it writable (its owner, permissions, a mounted disk with "
        "space), or name another folder",)
    assert main(["train", str(path), "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert got["kind"] == "TrainConfigError" and f"train.checkpoint_dir {folder} cannot be written" in got["error"]


def test_a_writable_checkpoint_dir_is_made_when_the_job_is_read(tmp_path):
    load_job(str(write_job(tmp_path, "job", checkpoint_dir="new/ck")))
    assert (tmp_path / "new" / "ck").is_dir() and list((tmp_path / "new" / "ck").iterdir()) == []  # no probe left
    load_job(str(write_job(tmp_path, "job", checkpoint_dir="new/ck")), here=False)  # for another machine: not tried


def test_malformed_train_threads_is_refused(tmp_path):
    for value in (0, "many", True, 1.5):
        with pytest.raises(TrainConfigError) as e:
            load_job(str(write_job(tmp_path, "job", threads=value)))
        assert e.value.problems == (
            "train.threads must be auto (torch's count in this process; resuming, the checkpoint's) or a whole number "
            f"of intra-op CPU threads >= 1, got {value!r}",)


# ----------------------------------------------------------------------------------------
# a save or a read that fails: a CheckpointError, one line, --json
# ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def files_at_most(limit: int):
    """No file of this process grows past ``limit`` bytes (RLIMIT_FSIZE; a write past it fails
    with EFBIG, as on a full disk, where SIGXFSZ would otherwise end the process)."""
    resource = pytest.importorskip("resource")
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_save_the_disk_refuses_is_a_checkpoint_error(tmp_path, capsys):
    path = write_job(tmp_path, "job", steps=2, checkpoint_dir="ck", checkpoint_every=1)
    with files_at_most(1 << 20):  # the checkpoint of the tiny Qwen3 is 11 MB
        rc = main(["train", str(path), "--json"])
    out = capsys.readouterr()
    assert rc == 1
    got = json.loads(out.out)  # the error, where the result was due
    final = tmp_path / "ck" / checkpoint_name(1)
    assert got["kind"] == "CheckpointError", got
    assert got["error"].startswith(f"cannot write the checkpoint of step 1 ({final}): rank 0: "), got["error"]
    assert got["error"].endswith(
        f"; make train.checkpoint_dir {tmp_path / 'ck'} writable, with room for a checkpoint (its owner, permissions, "
        "disk space), or name another folder; then resume (--resume: from the latest complete checkpoint there, none "
        "of which this save touched)"), got["error"]
    assert "Traceback" not in out.err and f"veomni-ops train: {got['error']}" in out.err
    assert not final.exists()  # nothing half-written passes for a checkpoint


def test_a_checkpoint_that_cannot_be_read_is_a_checkpoint_error(tmp_path, capsys, ck):
    """A checkpoint of an earlier veomni-ops (no hashes) with a truncated file: DCP's read fails,
    and says so in one line, naming the checkpoint and an earlier one to resume from."""
    step2 = ck / checkpoint_name(2)
    info = json.loads((step2 / INFO).read_text())
    for key in ("files", "config", "plan", "threads"):
        info.pop(key)
    (step2 / INFO).write_text(json.dumps(info))
    shard = step2 / SHARD
    shard.write_bytes(shard.read_bytes()[:1000])
    rc, got, err = resume(tmp_path, capsys)
    assert rc == 1 and got["kind"] == "CheckpointError", got
    assert got["error"].startswith(f"{step2}: cannot read the checkpoint (its files were not verified: it has no "
                                   "hashes): rank 0: "), got["error"]
    assert got["error"].endswith(f"; resume from an earlier checkpoint (--resume {ck / checkpoint_name(1)}, or "
                                 "train.resume: that path), or copy this one again from where it came from")
    assert "Traceback" not in err


# ----------------------------------------------------------------------------------------
# every file checked against its size and sha256 before it is read
# ----------------------------------------------------------------------------------------


def test_the_checkpoint_keeps_each_files_size_and_sha256(written):
    import hashlib

    step = written / checkpoint_name(2)
    files = json.loads((step / INFO).read_text())["files"]
    assert sorted(files) == [".metadata", SHARD]
    for name, kept in files.items():
        data = (step / name).read_bytes()
        assert kept == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize("damage, says", [
    ("truncate", f"{SHARD} is 1000 bytes, {{size}} when written (truncated, or written over)"),
    ("flip", f"{SHARD} has another sha256 than when written (altered: a bit flipped on the disk, or in a copy)"),
    ("remove", f"{SHARD} is missing"),
    ("metadata", ".metadata has another sha256 than when written (altered: a bit flipped on the disk, or in a copy)"),
])
def test_a_damaged_file_is_refused_naming_it(tmp_path, capsys, ck, damage, says):
    step2 = ck / checkpoint_name(2)
    shard = step2 / SHARD
    size = shard.stat().st_size
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:1000])
    elif damage == "remove":
        shard.unlink()
    else:  # one bit, in the middle of the tensors' data (or of DCP's metadata)
        target = shard if damage == "flip" else step2 / ".metadata"
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x10
        target.write_bytes(bytes(data))
    rc, got, err = resume(tmp_path, capsys)
    assert rc == 1 and got["kind"] == "CheckpointError", got
    assert got["error"] == (
        f"{step2}: the checkpoint is damaged: {says.format(size=size)}; resume from an earlier checkpoint (--resume "
        f"{ck / checkpoint_name(1)}, or train.resume: that path), or copy this one again from where it came from")
    assert "Traceback" not in err and "step   3/3" not in err


def test_a_checkpoint_without_hashes_is_read_with_a_warning(tmp_path, capsys, ck):
    """What veomni-ops wrote before it kept hashes, a config and a thread count: read, and said."""
    step2 = ck / checkpoint_name(2)
    info = json.loads((step2 / INFO).read_text())
    for key in ("files", "config", "plan", "threads"):
        info.pop(key)
    (step2 / INFO).write_text(json.dumps(info))
    rc, got, err = resume(tmp_path, capsys)
    assert rc == 0 and got["first_step"] == 3, got
    assert (f"warning: {step2} was written by an earlier veomni-ops ({info['versions']['veomni_ops']}): no hashes: its "
            "files are not verified; no config fingerprint: only its tensors' names and shapes are checked against "
            "this model; no thread count; no plan. The next checkpoint this run writes has them") in err
    assert "files" in json.loads((ck / checkpoint_name(3) / INFO).read_text())


# ----------------------------------------------------------------------------------------
# another model: every config field; another plan: said
# ----------------------------------------------------------------------------------------


def test_a_checkpoint_of_another_config_is_refused_naming_each_field(tmp_path, capsys, ck):
    """The changes the tensors' names and shapes do not show: rope, the activation."""
    written = json.loads((ck / checkpoint_name(2) / INFO).read_text())["config"]
    theta = written["rope_parameters"]["rope_theta"]
    rc, got, err = resume(tmp_path, capsys, model={"config": {"rope_theta": 10.0, "hidden_act": "gelu"}})
    assert rc == 1 and got["kind"] == "TrainConfigError", got
    assert got["error"] == (
        f"{ck / checkpoint_name(2)}: the checkpoint is of another model (written by qwen3 tiny): config fields that "
        f"differ (the checkpoint's -> this job's): hidden_act: \"silu\" -> \"gelu\", rope_parameters.rope_theta: "
        f"{json.dumps(theta)} -> 10.0. Resume with the model it was written for, or train this one into a fresh "
        "checkpoint_dir")
    # what does not change the model is not compared: a label, the initial weights' scale
    rc, got, err = resume(tmp_path, capsys, model={"config": {"initializer_range": 0.5}})
    assert rc == 0 and got["first_step"] == 3, got


def test_another_plan_is_said_not_refused(tmp_path, capsys, ck):
    """Another kernel for an op keeps the model (its state is the kernels'), but not the rounding."""
    written = json.loads((ck / checkpoint_name(2) / INFO).read_text())["plan"]
    assert written["cross_entropy/fused_linear"] == "chunked (veomni-ops)", written
    rc, got, err = resume(tmp_path, capsys, model={"ops_implementation": {"cross_entropy_loss_implementation":
                                                                          "eager"}})
    assert rc == 0 and got["first_step"] == 3, got
    assert ("another plan than the checkpoint's (cross_entropy/fused_linear: chunked (veomni-ops) -> (not bound), "
            "cross_entropy/logits: (not bound) -> eager (veomni-ops)): the losses differ by rounding from a run never "
            "stopped") in err, err
    assert got["kernels"]["cross_entropy/logits"] == "eager (veomni-ops)"


def test_the_same_job_resumes_with_nothing_said(tmp_path, capsys, ck):
    rc, got, err = resume(tmp_path, capsys)
    assert rc == 0 and got["first_step"] == 3 and got["resumed_from"] == str(ck / checkpoint_name(2)), got
    assert "differ by rounding" not in err and "warning" not in err and "damaged" not in err
