"""``veomni-ops train JOB --max-seq`` (issue 35): the search against a fake device memory, the
bound from the job's step-memory lower bound, what counts as out of memory, and the command end
to end with real probes (a tiny model on the CPU, each probe a process of its own)."""

from __future__ import annotations

import json

import pytest
from veomni_ops.train.maxseq import ERROR, OK, OOM, Probe, _between, granularity_for, is_oom, search


def fake_device(limit: int, per_token: int = 1, base: int = 0, fail_at: int | None = None):
    """A probe on a device of ``limit`` bytes where a row of ``seq`` tokens takes ``base + seq *
    per_token``; ``fail_at``: that seq_len fails with another error."""
    seen: list[int] = []

    def probe(seq: int) -> Probe:
        seen.append(seq)
        if seq == fail_at:
            return Probe(seq, ERROR, message="RuntimeError: the kernel has no such shape")
        need = base + seq * per_token
        if need > limit:
            return Probe(seq, OOM, message=f"MemoryError: {need} > {limit}")
        return Probe(seq, OK, peak_gib=need / 2**30, peak_kind="fake")

    probe.seen = seen  # type: ignore[attr-defined]
    return probe


def test_it_doubles_then_bisects_to_the_granularity():
    probe = fake_device(5000)
    got = search(probe, start=128, upper=2**20, granularity=256, max_probes=20)
    assert probe.seen == [128, 256, 512, 1024, 2048, 4096, 8192, 6144, 5120, 4608, 4864]
    assert (got["longest"], got["first_failed"], got["stopped"], got["error"]) == (4864, 5120, "bisected", None)
    assert [p["status"] for p in got["probes"]] == [OK] * 6 + [OOM] * 3 + [OK] * 2
    assert got["probes"][0]["peak_gib"] == 128 / 2**30


@pytest.mark.parametrize("limit", [300, 1000, 4097, 5000, 20_000, 99_999])
@pytest.mark.parametrize("start, granularity", [(128, 256), (1000, 256), (64, 64), (4096, 512)])
def test_the_answer_is_the_limit_to_one_granularity(limit, start, granularity):
    got = search(fake_device(limit), start=start, upper=2**20, granularity=granularity, max_probes=30)
    lo, hi = got["longest"], got["first_failed"]
    assert got["stopped"] == "bisected", got
    assert lo <= limit < hi
    assert hi - lo <= granularity or lo < granularity or lo == start or hi == start, got
    assert all(p["seq_len"] <= 2**20 for p in got["probes"])


def test_the_jobs_own_seq_len_already_fails():
    probe = fake_device(1000)
    got = search(probe, start=4096, upper=2**20, granularity=256)
    assert probe.seen == [4096, 2048, 1024, 512, 768]  # halves until one trains, then bisects
    assert (got["longest"], got["first_failed"], got["stopped"]) == (768, 1024, "bisected")


def test_nothing_trains():
    got = search(fake_device(1), start=16, upper=1024, granularity=256)
    assert [p["seq_len"] for p in got["probes"]] == [16, 8, 4, 2]
    assert (got["longest"], got["first_failed"], got["stopped"]) == (None, 2, "nothing trains")


def test_the_bound_is_never_passed_and_stops_the_search():
    probe = fake_device(10**9)
    got = search(probe, start=128, upper=1000, granularity=256)
    assert probe.seen == [128, 256, 512, 1000]
    assert (got["longest"], got["first_failed"], got["stopped"]) == (1000, None, "bound")
    # a job whose own seq_len is past the bound starts at the bound
    assert search(fake_device(10**9), start=4096, upper=1000)["probes"][0]["seq_len"] == 1000


def test_the_probe_limit_stops_the_search():
    got = search(fake_device(5000), start=128, upper=2**20, granularity=256, max_probes=3)
    assert [p["seq_len"] for p in got["probes"]] == [128, 256, 512]
    assert (got["longest"], got["first_failed"], got["stopped"]) == (512, None, "probe limit")


def test_an_unexpected_error_stops_the_search_with_it():
    probe = fake_device(10**9, fail_at=1024)
    got = search(probe, start=128, upper=2**20, granularity=256)
    assert probe.seen == [128, 256, 512, 1024]  # nothing after the error
    assert (got["longest"], got["first_failed"], got["stopped"]) == (512, None, "error")
    assert got["error"] == "RuntimeError: the kernel has no such shape"


def test_granularity_and_midpoints():
    assert granularity_for(256, 1) == 256 and granularity_for(256, 3) == 768 and granularity_for(256, 4) == 256
    assert _between(4096, 8192, 256) == 6144 and _between(4864, 5120, 256) is None and _between(16, 32, 256) is None
    with pytest.raises(ValueError):
        search(fake_device(10), start=1, upper=10)


@pytest.mark.parametrize("kind, message, oom", [
    ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", True),
    ("MemoryError", "", True),
    ("AcceleratorError", "CUDA error: out of memory", True),
    ("TrainConfigError", "job.yaml: --seq-len 9999999: train.seq_len 9,999,999 and batch_size 4: one training step "
                         "needs at least 80.0 GiB on each rank", True),
    ("TrainConfigError", "job.yaml: train.lr must be a number > 0", False),
    ("RuntimeError", "shape mismatch", False),
])
def test_what_counts_as_out_of_memory(kind, message, oom):
    assert is_oom(kind, message) is oom


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from veomni_ops.cli import main  # noqa: E402
from veomni_ops.train import load_job  # noqa: E402
from veomni_ops.train.job import min_step_bytes  # noqa: E402
from veomni_ops.train.maxseq import memory_bound  # noqa: E402


def write(tmp_path, train: str, extra: str = "") -> str:
    p = tmp_path / "job.yaml"
    p.write_text(f"model: {{architecture: qwen3, size: tiny}}\ntrain: {train}\n{extra}")
    return str(p)


@pytest.mark.parametrize("extra", ["", "parallel: {dp_shard: 2, sp: 2}\n"])
def test_the_bound_is_the_longest_the_loaders_lower_bound_fits(tmp_path, extra):
    job = load_job(write(tmp_path, "{batch_size: 4, seq_len: 128, device: cpu}", extra), here=False)
    memory = 3 * 2**30
    bound = memory_bound(job, memory)

    def need(seq):
        return min_step_bytes({**job, "train": {**job["train"], "seq_len": seq}})[0]

    assert need(bound) <= memory < need(bound + 1)
    assert memory_bound(job, 1000) is None  # not even 2 tokens (the embedding alone is bigger)


@pytest.mark.parametrize("option, value, words", [
    ("--steps", "0", "expected a whole number of steps >= 1, got '0'"),
    ("--max-seq-steps", "x", "expected a whole number of steps >= 1, got 'x'"),
    ("--max-seq-probes", "0", "expected a whole number of probes >= 1, got '0'"),
    ("--max-seq-granularity", "-256", "expected a whole number of tokens >= 1, got '-256'"),
    ("--seq-len", "1", "expected a whole number of tokens >= 2 (the loss predicts each next token), got '1'"),
    ("--max-seq-upto", "1.5", "expected a whole number of tokens >= 2 (the loss predicts each next token)"),
])
def test_each_numeric_option_names_its_own_unit(tmp_path, capsys, option, value, words):
    path = write(tmp_path, "{batch_size: 2, seq_len: 16, device: cpu}")
    with pytest.raises(SystemExit):
        main(["train", path, option, value])
    assert f"argument {option}: {words}" in capsys.readouterr().err


def test_seq_len_past_the_devices_memory_is_refused_as_the_loader_refuses(tmp_path, capsys):
    path = write(tmp_path, "{batch_size: 2, seq_len: 16, device: cpu}")
    assert main(["train", path, "--seq-len", str(2**38), "--json"]) == 1
    err = json.loads(capsys.readouterr().out)
    assert err["kind"] == "TrainConfigError" and "--seq-len 274877906944" in err["error"]
    assert "one training step needs at least" in err["error"] and is_oom(err["kind"], err["error"])


def test_max_seq_refuses_what_it_does_not_search(tmp_path, capsys):
    path = write(tmp_path, "{batch_size: 2, seq_len: 16, device: cpu}")
    assert main(["train", path, "--max-seq", "--compare", path, "--json"]) == 1
    err = json.loads(capsys.readouterr().out)
    assert err["error"] == "--max-seq searches CONFIG's job and its --baseline runs only; drop --compare"
    assert main(["train", path, "--max-seq", "--max-seq-upto", "8", "--json"]) == 1
    assert "below the job's train.seq_len 16" in json.loads(capsys.readouterr().out)["error"]


def test_the_command_end_to_end_with_real_probes(tmp_path, capsys):
    """Two real probes of the tiny Qwen3 on the CPU, each in a process of its own, up to a small
    bound: both train, each with its peak memory, and the search stops at the bound. The job's
    checkpoint_dir gets nothing."""
    path = write(tmp_path, "{batch_size: 2, seq_len: 32, device: cpu, checkpoint_dir: ckpt}")
    assert main(["train", path, "--max-seq", "--max-seq-upto", "64", "--json"]) == 0
    assert list((tmp_path / "ckpt").iterdir()) == []  # a probe writes no checkpoint
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["upper"] == 64 and out["passed"] is True and out["bound"] > 64
    (run,) = out["max_seq"]
    assert run["run"] == "job.yaml" and run["baseline"] is None
    assert (run["longest"], run["first_failed"], run["stopped"]) == (64, None, "bound")
    assert [(p["seq_len"], p["status"]) for p in run["probes"]] == [(32, "ok"), (64, "ok")]
    assert all(p["peak_gib"] > 0 and p["peak_kind"] == "peak RSS" for p in run["probes"])
    assert "seq_len        64: trains, peak RSS" in captured.err
    assert "longest train.seq_len that trains" in captured.err


def test_seq_len_reaches_every_run_of_a_comparison(tmp_path, monkeypatch):
    from veomni_ops.train import command, loop

    path = write(tmp_path, "{batch_size: 2, seq_len: 16, device: cpu}")
    seen = []
    monkeypatch.setattr(command, "run_child", lambda p, *a, **k: seen.append(k) or
                        {"run": p, "losses": [1.0], "tokens_per_s": 1.0, "dtype": "float32", "steps": 1})
    monkeypatch.setattr(command, "report", lambda runs, *a: {"passed": True, "checks": [{}] * len(runs), "rule": ""})
    monkeypatch.setattr(command, "print_report", lambda *a: None)
    assert main(["train", path, "--baseline", "transformers", "--seq-len", "24"]) == 0
    assert [k["seq_len"] for k in seen] == [24, 24]
    cmd = []
    monkeypatch.setattr(loop.subprocess, "run", lambda c, **k: cmd.append(c) or pytest.fail("stop"))
    with pytest.raises(pytest.fail.Exception):
        loop.run_child(path, 0, seq_len=24)
    assert cmd[0][-2:] == ["--seq-len", "24"]
