"""Plan locks and ``veomni-ops tune``: the lock's format, when ``auto`` takes it and when it
refuses it, tuning with an injected timer (deterministic), resuming an interrupted tune, the dry
run, and one real tune of a tiny job on the CPU.

Real training is on a 1-layer Qwen3 of hidden size 32, 2 x 8 tokens, one or two steps a trial.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import warnings
from pathlib import Path

import pytest
from conftest import make_plugin
from veomni_ops import HardwareRequirement, KernelSpec, OpsConfig, build_registry, resolve
from veomni_ops.device import DeviceInfo
from veomni_ops.lock import (
    ENV_LOCK,
    FORMAT,
    KIND,
    LockChoice,
    LockError,
    LockFile,
    LockMismatchError,
    LockWarning,
    PlanLock,
    active_lock,
    device_fingerprint,
    load_lock,
    mismatches,
    versions_here,
)

H100 = DeviceInfo("cuda", (9, 0), "NVIDIA H100 80GB HBM3", overridden=True)
CPU = DeviceInfo("cpu", None, "cpu")
STD = {"rms_norm": ["standard"]}


@pytest.fixture
def two_norms():
    """rms_norm: ``slow`` (priority 5) and ``fast`` (priority 1), both portable and compilable,
    and ``eager`` (priority 0, the compile-mode preference on CUDA); ``hopper`` runs on sm90 only."""
    specs = [
        KernelSpec(name="slow", op="rms_norm", variant="standard", factory="math:sqrt", priority=5,
                   supports_compile=True),
        KernelSpec(name="fast", op="rms_norm", variant="standard", factory="math:floor", priority=1,
                   supports_compile=True),
        KernelSpec(name="hopper", op="rms_norm", variant="standard", factory="math:trunc", priority=0,
                   hardware=HardwareRequirement(("cuda",), min_capability=(9, 0), max_capability=(9, 0))),
    ]
    plugin = make_plugin("toy", rms_norm=specs)
    plugin.VEOMNI_OPS_PLUGIN_API = ">=1.0,<2"  # type: ignore[attr-defined]
    # 'eager' is the core's name: its stand-in is registered as the core's
    core = make_plugin("veomni-ops", rms_norm=[KernelSpec(name="eager", op="rms_norm", variant="standard",
                                                          factory="math:ceil", priority=0, supports_compile=True)])
    return build_registry([("toy", plugin), ("veomni-ops", core)], include_entry_points=False, env={})


def lock_for(device: DeviceInfo, kernel: str = "fast", *, mode: str = "eager", dtype: str | None = None,
             **fields) -> PlanLock:
    """A lock of this machine's versions for ``device`` choosing ``kernel`` for rms_norm/standard."""
    choice = LockChoice("rms_norm", ("standard",), "standard", kernel, "toy", f"{kernel} measured fastest")
    base = dict(device=device_fingerprint(device), versions=versions_here(["toy"]), mode=mode, dtype=dtype,
                choices=(choice,), job="job.yaml")
    return PlanLock(**{**base, **fields})


# ----------------------------------------------------------------------------------------
# the lock's format
# ----------------------------------------------------------------------------------------


def test_lock_file_round_trips_with_every_recorded_field(tmp_path):
    lock = lock_for(CPU, shapes={"hidden_size": 32, "tokens_per_step": 16}, created="2026-11-26T00:00:00Z",
                    measurements={"static": {"median_ms": 2.0, "step_ms": [2.0]}}, static_step_ms=2.0,
                    tuned_step_ms=1.5, method={"timed_steps": 1})
    path = tmp_path / "x.lock.json"
    lock.save(path)
    data = json.loads(path.read_text())
    assert data["kind"] == KIND and data["format"] == FORMAT
    assert data["device"] == {"type": "cpu", "name": "cpu", "capability": None}
    assert set(data["versions"]) == {"torch", "triton", "transformers", "veomni-ops", "plugins"}
    assert data["versions"]["plugins"] == {"toy": None}  # a plugin not installed as a distribution
    assert data["choices"][0]["kernel"] == "fast" and data["choices"][0]["variants"] == ["standard"]
    back = load_lock(path)
    assert back.to_dict() == lock.to_dict() and back.source == str(path) and back.explicit


@pytest.mark.parametrize("content, words", [
    ("{not json", "cannot be read as JSON"),
    ('{"kind": "something else"}', "not a plan lock"),
    (json.dumps({"kind": KIND, "format": 99}), "format 99"),
    (json.dumps({"kind": KIND, "format": FORMAT, "device": {}, "versions": {}, "mode": "eager"}), "no 'choices'"),
    (json.dumps({"kind": KIND, "format": FORMAT, "device": {}, "versions": {}, "mode": "eager",
                 "choices": [{"op": "rms_norm", "variant": "wide", "kernel": "k", "distribution": "d"}]}),
     "rms_norm/wide"),
    (json.dumps({"kind": KIND, "format": FORMAT, "device": {}, "versions": {}, "mode": "fast", "choices": []}),
     "mode 'fast'"),
])
def test_malformed_lock_is_refused_naming_file_and_fix(tmp_path, content, words):
    path = tmp_path / "bad.lock.json"
    path.write_text(content)
    with pytest.raises(LockError, match="bad.lock.json") as e:
        load_lock(path)
    assert words in str(e.value) and "veomni-ops tune" in str(e.value)


def test_mismatches_name_every_difference():
    assert mismatches(lock_for(H100), H100, compile=False) == []
    other = lock_for(DeviceInfo("cuda", (9, 0), "NVIDIA H200"), mode="compile", dtype="bfloat16",
                     versions={**versions_here(["toy"]), "torch": "0.0.1", "plugins": {"veomni-nothing": "1.0"}})
    got = " | ".join(mismatches(other, H100, compile=False, dtype="float32"))
    for words in ("device name: the lock was tuned on 'NVIDIA H200', this is 'NVIDIA H100 80GB HBM3'",
                  "torch: the lock was tuned with 0.0.1, installed is",
                  "plugin veomni-nothing: the lock was tuned with 1.0, installed is not installed",
                  "mode: the lock was tuned in compile mode, this resolves for eager mode",
                  "dtype: the lock was tuned for bfloat16, this model is float32"):
        assert words in got
    cap = lock_for(DeviceInfo("cuda", (8, 0), "NVIDIA H100 80GB HBM3"))
    assert mismatches(cap, H100) == ["device capability: the lock was tuned on 8.0, this is 9.0"]


# ----------------------------------------------------------------------------------------
# auto and the lock: what it outranks, what outranks it, when it is refused
# ----------------------------------------------------------------------------------------


def test_matching_lock_outranks_static_priority(two_norms):
    assert resolve(OpsConfig(), CPU, registry=two_norms, needs=STD).get("rms_norm", "standard").kernel == "slow"
    plan = resolve(OpsConfig(), CPU, registry=two_norms, needs=STD, lock=lock_for(CPU))
    entry = plan.get("rms_norm", "standard")
    assert entry.kernel == "fast" and entry.requested == "auto"
    assert entry.reason == "auto by plan lock <in memory>: fast measured fastest"
    assert plan.lock and "tuned" in plan.lock and "plan lock" in plan.table() and plan.to_dict()["lock"] == plan.lock


def test_matching_lock_outranks_compile_preference(two_norms):
    static = resolve(OpsConfig(), H100, registry=two_norms, needs=STD, compile=True).get("rms_norm", "standard")
    assert static.kernel == "eager" and "by measurement" in static.reason  # compile_policy's choice on CUDA
    plan = resolve(OpsConfig(), H100, registry=two_norms, needs=STD, compile=True,
                   lock=lock_for(H100, mode="compile"))
    assert plan.get("rms_norm", "standard").kernel == "fast"


def test_named_kernel_is_never_replaced_by_the_lock(two_norms):
    plan = resolve(OpsConfig(rms_norm_implementation="slow"), CPU, registry=two_norms, needs=STD,
                   lock=lock_for(CPU))
    assert plan.get("rms_norm", "standard").kernel == "slow"
    assert plan.get("rms_norm", "standard").reason == "requested by name"


def test_lock_choice_unusable_here_falls_back_to_static_and_says_why(two_norms):
    plan = resolve(OpsConfig(), CPU, registry=two_norms, needs=STD, lock=lock_for(CPU, kernel="gone"))
    entry = plan.get("rms_norm", "standard")
    assert entry.kernel == "slow"
    assert "passed over the plan lock's gone@toy (not registered here)" in entry.reason
    entry = resolve(OpsConfig(), CPU, registry=two_norms, needs=STD, lock=lock_for(CPU, kernel="hopper")).get(
        "rms_norm", "standard")
    assert entry.kernel == "slow" and "passed over the plan lock's hopper@toy (needs a cuda device, this is cpu)" \
        in entry.reason
    lock = dataclasses.replace(lock_for(CPU), choices=())
    entry = resolve(OpsConfig(), CPU, registry=two_norms, needs=STD, lock=lock).get("rms_norm", "standard")
    assert entry.kernel == "slow" and "has no choice for rms_norm/standard" in entry.reason


def test_explicit_lock_that_does_not_match_is_an_error(two_norms, tmp_path):
    path = tmp_path / "h200.lock.json"
    lock_for(DeviceInfo("cuda", (9, 0), "NVIDIA H200")).save(path)
    with pytest.raises(LockMismatchError) as e:
        resolve(OpsConfig(), H100, registry=two_norms, needs=STD, lock=str(path))
    text = str(e.value)
    assert "h200.lock.json" in text and "device name" in text and "NVIDIA H200" in text
    assert "Re-tune on this machine (veomni-ops tune job.yaml" in text and "pass no lock" in text
    assert e.value.problems == ("device name: the lock was tuned on 'NVIDIA H200', this is 'NVIDIA H100 80GB HBM3'",)
    with pytest.raises(LockMismatchError, match="mode: the lock was tuned in eager mode"):
        resolve(OpsConfig(), CPU, registry=two_norms, needs=STD, compile=True, lock=lock_for(CPU))
    with pytest.raises(LockError, match="no such file"):
        resolve(OpsConfig(), CPU, registry=two_norms, needs=STD, lock=str(tmp_path / "none.json"))


def test_found_lock_that_does_not_match_is_ignored_with_a_warning(two_norms, tmp_path, monkeypatch):
    path = tmp_path / "old.lock.json"
    lock_for(CPU, versions={**versions_here(["toy"]), "transformers": "4.0.0"}).save(path)
    monkeypatch.setenv(ENV_LOCK, str(path))
    with pytest.warns(LockWarning, match=r"ignoring plan lock .*old.lock.json \(VEOMNI_OPS_LOCK\).*transformers: "
                                         r"the lock was tuned with 4.0.0"):
        plan = resolve(OpsConfig(), CPU, registry=two_norms, needs=STD)
    assert plan.get("rms_norm", "standard").kernel == "slow" and plan.lock is None
    monkeypatch.setenv(ENV_LOCK, str(tmp_path / "not-yet.json"))
    with pytest.warns(LockWarning, match="does not exist: auto uses the static priorities"):
        assert resolve(OpsConfig(), CPU, registry=two_norms, needs=STD).get("rms_norm", "standard").kernel == "slow"


def test_found_lock_that_matches_is_used_and_lock_false_uses_none(two_norms, tmp_path, monkeypatch):
    path = tmp_path / "here.lock.json"
    lock_for(CPU).save(path)
    monkeypatch.setenv(ENV_LOCK, str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = resolve(OpsConfig(), CPU, registry=two_norms, needs=STD)
    assert plan.get("rms_norm", "standard").kernel == "fast" and "(VEOMNI_OPS_LOCK;" in plan.lock
    assert resolve(OpsConfig(), CPU, registry=two_norms, needs=STD, lock=False).get("rms_norm", "standard").kernel \
        == "slow"
    found = LockFile(str(path), explicit=False, origin="lock: in job.yaml")
    assert active_lock(found, CPU).origin == "lock: in job.yaml"


def test_lock_choice_prefers_the_same_request():
    a = LockChoice("cross_entropy", ("fused_linear", "logits"), "logits", "eager", "veomni-ops", "a")
    b = LockChoice("cross_entropy", ("logits",), "logits", "other", "x", "b")
    lock = dataclasses.replace(lock_for(CPU), choices=(a, b))
    assert lock.choice("cross_entropy", ("logits",)) is b
    assert lock.choice("cross_entropy", ("fused_linear", "logits")) is a
    assert lock.choice("cross_entropy", ("fused_linear",)) is None


# ----------------------------------------------------------------------------------------
# jobs: a tiny Qwen3 on the CPU
# ----------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from veomni_ops import train, tune  # noqa: E402
from veomni_ops.cli import main  # noqa: E402

TINY = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64, "vocab_size": 128,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}


def write_job(tmp_path: Path, name: str = "job.yaml", lock: str | None = None, **train_fields) -> str:
    import yaml

    t = {"batch_size": 2, "seq_len": 8, "steps": 2, "lr": 1e-3, "dtype": "float32", "device": "cpu", "seed": 0,
         **train_fields}
    data: dict = {"model": {"architecture": "qwen3", "size": "tiny", "config": dict(TINY),
                            "ops_implementation": {"attn_implementation": "auto"}}, "train": t}
    if lock is not None:
        data["lock"] = lock
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_train_and_resolve_read_the_lock(tmp_path, capsys):
    """The job's ``lock:`` key (found: a missing file warns), ``--lock`` (explicit: a mismatch is an error)."""
    from veomni_ops.device import detected_device

    choice = LockChoice("attention", ("standard",), "standard", "eager", "veomni-ops", "eager measured fastest")
    lock = PlanLock(device=device_fingerprint(detected_device()), versions=versions_here([]), mode="eager",
                    dtype="float32", choices=(choice,), job="job.yaml")
    lock.save(tmp_path / "tiny.lock.json")
    job = write_job(tmp_path, lock="tiny.lock.json")
    res = train.train_one(train.load_job(job), out=io.StringIO())
    entry = next(e for e in res["plan"]["entries"] if e["op"] == "attention")
    assert entry["kernel"] == "eager" and entry["reason"].startswith("auto by plan lock ")
    assert res["plan"]["lock"].startswith(f"{tmp_path / 'tiny.lock.json'} (lock: in {job};")
    assert main(["resolve", job]) == 0  # resolve reads the job's lock: key too
    assert "plan lock" in capsys.readouterr().out
    assert main(["resolve", job, "--lock", str(tmp_path / "tiny.lock.json"), "--compile"]) == 1
    err = capsys.readouterr().err
    assert "(--lock) does not match here: mode: the lock was tuned in eager mode, this resolves for compile" in err
    dataclasses.replace(lock, mode="compile").save(tmp_path / "compile.lock.json")
    assert main(["train", job, "--lock", str(tmp_path / "compile.lock.json"), "--steps", "1"]) == 1
    assert "does not match here: mode: the lock was tuned in compile mode" in capsys.readouterr().err
    missing = write_job(tmp_path, name="later.yaml", lock="later.lock.json")
    assert main(["train", missing, "--steps", "1"]) == 0
    assert "warning: plan lock " in capsys.readouterr().err  # not tuned yet: static auto, said once
    with pytest.raises(train.TrainConfigError, match="lock must be the path of a plan lock file"):
        train.load_job(write_job(tmp_path, name="bad.yaml", lock=""))


def test_apply_takes_a_lock_with_a_config_not_with_a_plan(tmp_path):
    from veomni_ops.binding import BindingError, apply

    model = train.build_model(train.load_job(write_job(tmp_path)), "meta")
    plan = apply(model, {}, lock=False).plan
    assert plan.lock is None
    with pytest.raises(BindingError, match="a plan lock applies when resolving: pass apply\\(model, config, lock="):
        apply(model, plan, lock="some.lock.json")


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    """The tune setup of the tiny job: its requests and candidates on this CPU."""
    return tune.setup(train.load_job(write_job(tmp_path_factory.mktemp("job"))))


def test_setup_lists_the_candidates_of_each_auto_op(tiny_setup):
    s = tiny_setup
    by_label = {r.label: r for r in s.requests}
    att = by_label["attention/standard"]
    assert att.static.full_name == "sdpa@veomni-ops/standard"
    assert {c.full_name for c in att.candidates} == {"eager@veomni-ops/standard", "sdpa@veomni-ops/standard"}
    ce = by_label["cross_entropy/fused_linear|logits"]
    assert {c.full_name for c in ce.candidates} >= {"chunked@veomni-ops/fused_linear", "eager@veomni-ops/logits"}
    assert not by_label["rms_norm/standard"].timed
    keys = [t.key for t in s.trials()]
    assert keys[0] == "static" and "attention/standard:eager@veomni-ops/standard" in keys
    assert "attention/standard:sdpa@veomni-ops/standard" not in keys  # the static choice is the static trial
    assert s.mode == "eager" and s.dtype == "float32" and s.shapes["hidden_size"] == 32
    assert s.shapes["tokens_per_step"] == 16


FAKE_MS = {"static": 10.0, "attention/standard:eager@veomni-ops/standard": 8.0, "tuned": 7.5}


class FakeTimer:
    """Deterministic step times per trial key (default 12 ms); equal losses unless told; records calls;
    ``interrupt_at``: raise KeyboardInterrupt at that call (1-based), as Ctrl-C would."""

    def __init__(self, ms=None, losses=None, fail=(), interrupt_at=None):
        self.ms, self.losses, self.fail, self.interrupt_at = {**FAKE_MS, **(ms or {})}, losses or {}, fail, interrupt_at
        self.calls: list[str] = []

    def __call__(self, trial):
        self.calls.append(trial.key)
        if self.interrupt_at == len(self.calls):
            raise KeyboardInterrupt
        if trial.key in self.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        ms = self.ms.get(trial.key, 12.0)
        return tune.Measurement([ms, ms + 1, ms - 1], self.losses.get(trial.key, [5.0, 4.0]), 0.1)


def test_tune_with_a_fake_timer_chooses_by_step_time_and_writes_the_lock(tiny_setup, tmp_path):
    out = str(tmp_path / "job.lock.json")
    timer = FakeTimer()
    stream = io.StringIO()
    lock = tune.Tuner(tiny_setup, out, timer, stream=stream).run()
    assert timer.calls == [t.key for t in tiny_setup.trials()] + ["static-again", "tuned"]
    att = lock.choice("attention", ("standard",))
    assert att.full_name == "eager@veomni-ops/standard" and att.static == "sdpa@veomni-ops/standard"
    assert att.step_ms == 8.0 and att.static_step_ms == 10.0
    assert att.why.startswith("measured fastest in the job's step: 8.00 vs 10.00 ms for the static "
                              "sdpa@veomni-ops/standard (-20.0%")
    ce = lock.choice("cross_entropy", ("fused_linear", "logits"))
    assert ce.full_name == ce.static == "chunked@veomni-ops/fused_linear"  # every other CE candidate: 12 ms
    assert ce.why.startswith("the static choice kept: no candidate 1% faster than its 10.00 ms")
    assert lock.choice("rms_norm", ("standard",)).why.startswith("the only kernel usable here")
    assert (lock.static_step_ms, lock.tuned_step_ms) == (10.0, 7.5)
    on_disk = load_lock(out)
    assert on_disk.to_dict() == lock.to_dict() and mismatches(on_disk, tiny_setup.device, compile=False) == []
    assert set(on_disk.measurements) == set(timer.calls) and not os.path.exists(tune.side_path(out))
    lines = stream.getvalue().splitlines()  # not a terminal: one plain line per trial
    n = len(timer.calls)
    assert lines[0].startswith("tune [") and f"1/{n}" in lines[0] and "static auto" in lines[0]
    assert lines[-1].startswith(f"tune [{'#' * 24}] {n}/{n}") and "7.50 ms/step (median of 3)" in lines[-1]


def test_a_small_gain_a_failed_candidate_and_other_losses_keep_the_static_choice(tiny_setup, tmp_path):
    att = "attention/standard:eager@veomni-ops/standard"
    ce = [t.key for t in tiny_setup.trials() if t.key.startswith("cross_entropy")]
    timer = FakeTimer(ms={att: 9.95, ce[0]: 5.0, ce[1]: 6.0, "tuned": 9.0}, fail=(ce[0],),
                      losses={ce[1]: [5.0, 4.1]})
    lock = tune.Tuner(tiny_setup, str(tmp_path / "l.json"), timer, stream=io.StringIO()).run()
    assert lock.choice("attention", ("standard",)).kernel == "sdpa"  # 0.5% faster: below --min-gain
    why = lock.choice("cross_entropy", ("fused_linear", "logits")).why
    assert lock.choice("cross_entropy", ("fused_linear", "logits")).kernel == "chunked"
    assert "refused: RuntimeError: CUDA error" in why
    assert "refused: loss 4.1 at step 2 differs from the static plan's 4 by more than 0.001 relative" in why
    assert lock.measurements[ce[0]]["error"].startswith("RuntimeError") and "tuned" not in timer.calls
    lock = tune.Tuner(tiny_setup, str(tmp_path / "l2.json"), FakeTimer(ms={att: 9.95}), min_gain=0.0,
                      stream=io.StringIO()).run()
    assert lock.choice("attention", ("standard",)).kernel == "eager"


def test_tuned_plan_not_faster_than_static_keeps_the_static_choices(tiny_setup, tmp_path):
    """Each candidate alone measured faster, the tuned plan (all of them) not: the choices
    interacted, or the machine moved; the lock keeps every static choice, saying why."""
    for tuned_ms in (11.0, 9.95):  # slower; faster, but by less than --min-gain (1%)
        with pytest.warns(tune.TuneWarning, match=rf"the tuned plan measured {tuned_ms:.2f} ms/step against the "
                                                  r"static plan's 10.00 \(the faster of its two timings; the tuned "
                                                  r"plan: eager@veomni-ops/standard\)"):
            lock = tune.Tuner(tiny_setup, str(tmp_path / f"l{tuned_ms}.json"), FakeTimer(ms={"tuned": tuned_ms}),
                              stream=io.StringIO()).run()
        att = lock.choice("attention", ("standard",))
        assert att.full_name == att.static == "sdpa@veomni-ops/standard"
        assert "every op keeps its static choice; alone, eager@veomni-ops/standard had measured 8.00 ms" in att.why
        # the lock table's short why (up to the first parenthesis) says the choice was kept, and why
        assert att.why.split(" (")[0] == (f"the static choice kept: the tuned plan measured {tuned_ms:.2f} ms/step "
                                          "against the static plan's 10.00")
        assert (lock.static_step_ms, lock.tuned_step_ms) == (10.0, tuned_ms)


@pytest.mark.parametrize("tuned_ms, summary", [
    (57.47, "kept: the static plan, 10.00 ms/step; the tuned plan measured 57.47 ms/step (0.174x the static plan's "
            "speed) and was not kept"),
    (7.5, "kept: the tuned plan, 7.50 ms/step against the static plan's 10.00 ms/step (both measured in this tune): "
          "1.333x the static plan's speed"),
])
def test_closing_summary_gives_the_speed_of_the_plan_the_lock_keeps(tiny_setup, tmp_path, tuned_ms, summary):
    """The tuned plan rejected (slower than the static one), the lock keeps the static plan: the
    summary says so, and 0.174x is the rejected plan's speed, not the kept one's (it said "tuned
    57.47 ms/step: 0.174x the static plan's speed" after keeping the static plan)."""
    out = str(tmp_path / "l.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tune.TuneWarning)
        lock = tune.Tuner(tiny_setup, out, FakeTimer(ms={"tuned": tuned_ms}), stream=io.StringIO()).run()
    stream = io.StringIO()
    tune.command.report(lock, tiny_setup, out, stream)
    assert summary in stream.getvalue().splitlines()[-2], stream.getvalue()


def test_a_candidate_must_beat_the_faster_of_the_two_static_timings(tiny_setup, tmp_path):
    """The first static timing was slow (the machine warming up, another job on the host): timed
    again after the candidates at 7.9 ms, it is the reference, and the 8 ms candidate loses."""
    timer = FakeTimer(ms={"static-again": 7.9})
    lock = tune.Tuner(tiny_setup, str(tmp_path / "l.json"), timer, stream=io.StringIO()).run()
    att = lock.choice("attention", ("standard",))
    assert att.kernel == "sdpa" and att.why.startswith("the static choice kept: no candidate 1% faster than its 7.90 ms")
    assert "tuned" not in timer.calls and lock.static_step_ms == 7.9


def test_static_plan_that_fails_stops_the_tune(tiny_setup, tmp_path):
    with pytest.raises(tune.TuneError, match="does not train with its static plan .*veomni-ops train JOB.yaml"):
        tune.Tuner(tiny_setup, str(tmp_path / "l.json"), FakeTimer(fail=("static",)), stream=io.StringIO()).run()


def test_interrupted_tune_resumes_without_timing_again(tiny_setup, tmp_path, capsys):
    out = str(tmp_path / "job.lock.json")
    trials = [t.key for t in tiny_setup.trials()]
    with pytest.raises(KeyboardInterrupt):
        tune.Tuner(tiny_setup, out, FakeTimer(interrupt_at=3), stream=io.StringIO()).run()
    assert not os.path.exists(out)
    kept = json.loads(Path(tune.side_path(out)).read_text())["measurements"]
    assert list(kept) == trials[:2]
    second = FakeTimer()
    stream = io.StringIO()
    lock = tune.Tuner(tiny_setup, out, second, stream=stream).run()
    assert second.calls == trials[2:] + ["static-again", "tuned"]
    assert stream.getvalue().count("(measured before: kept)") == 2
    assert lock.measurements["static"] == kept["static"] and not os.path.exists(tune.side_path(out))
    full = tune.Tuner(tiny_setup, str(tmp_path / "full.json"), FakeTimer(), stream=io.StringIO()).run()
    assert [c.to_dict() for c in lock.choices] == [c.to_dict() for c in full.choices]


def test_side_file_of_another_setup_is_not_resumed(tiny_setup, tmp_path):
    out = str(tmp_path / "job.lock.json")
    with pytest.raises(KeyboardInterrupt):
        tune.Tuner(tiny_setup, out, FakeTimer(interrupt_at=2), method={"timed_steps": 5},
                   stream=io.StringIO()).run()
    timer = FakeTimer()
    with pytest.warns(tune.TuneWarning, match="not resumed, its measurements were made under another method"):
        tune.Tuner(tiny_setup, out, timer, method={"timed_steps": 3}, stream=io.StringIO()).run()
    assert timer.calls[0] == "static"
    Path(tune.side_path(out)).write_text("{half a file")
    with pytest.warns(tune.TuneWarning, match="unreadable"):
        tune.Tuner(tiny_setup, out, FakeTimer(), stream=io.StringIO())
    timer = FakeTimer()
    tune.Tuner(tiny_setup, out, timer, fresh=True, stream=io.StringIO()).run()
    assert timer.calls[0] == "static"


def test_dry_run_prints_what_it_would_time(tmp_path, capsys):
    job = write_job(tmp_path)
    out = str(tmp_path / "job.lock.json")
    assert main(["tune", job, "--dry-run", "--steps", "3"]) == 0
    text = capsys.readouterr().out
    assert f"lock: {out}" in text and "cpu (cpu), eager mode, float32, batch 2 x seq 8 = 16 tokens/step" in text
    assert "each 2 warm-up + 3 timed steps" in text and "; each trial in a fresh Python process of its own" in text
    lines = [ln.split() for ln in text.splitlines()]
    assert ["1", "static", "every", "op", "at", "its", "static", "auto", "choice"] in lines
    assert any(ln[1:4] == ["attention/standard", "eager@veomni-ops/standard", "sdpa@veomni-ops/standard"]
               for ln in lines if len(ln) >= 4)
    assert "rms_norm/standard: eager@veomni-ops/standard" in text  # one usable kernel: not timed
    assert not os.path.exists(out) and not os.path.exists(tune.side_path(out))
    # Measurements an interrupted tune kept are marked.
    s = tune.setup(train.load_job(job))
    with pytest.raises(KeyboardInterrupt):
        tune.Tuner(s, out, FakeTimer(interrupt_at=2), method=tune.command._method(5, 2, False, 0.01),
                   stream=io.StringIO()).run()
    assert main(["tune", job, "--dry-run", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("(measured before: kept)") == 1
    assert json.loads(captured.out)["trials"][0] == {"key": "static", "label": s.trials()[0].label}
    # ... only those the real tune would resume: not under other settings, and it says why.
    assert main(["tune", job, "--dry-run", "--steps", "3"]) == 0
    text = capsys.readouterr().out
    assert "(measured before: kept)" not in text
    assert f"{tune.side_path(out)}: not resumed, its measurements were made under another method" in text


def test_tune_refusals_name_the_fix(tmp_path, capsys, monkeypatch):
    job = write_job(tmp_path)
    assert main(["tune", job, "--op", "norm", "--dry-run"]) == 1
    assert "--op norm: no such op; the ops: rms_norm" in capsys.readouterr().err
    with monkeypatch.context() as m:
        m.setenv("VEOMNI_OPS_DEVICE", "cuda:9.0")  # planning for an H100 from this machine: a dry run only
        gpu_job = write_job(tmp_path, name="gpu.yaml", device="cuda")
        assert main(["tune", gpu_job, "--dry-run"]) == 0
        assert "cuda:9.0 (from VEOMNI_OPS_DEVICE=cuda:9.0), eager mode" in capsys.readouterr().out
        assert main(["tune", gpu_job]) == 1
        assert "the plan's device cuda:9.0 (from VEOMNI_OPS_DEVICE) is not this machine's" in capsys.readouterr().err
    par = tmp_path / "par.yaml"
    par.write_text(Path(job).read_text() + "parallel: {dp_shard: 2}\n")
    assert main(["tune", str(par), "--dry-run"]) == 1
    assert "tune times one process" in capsys.readouterr().err


def test_a_gpu_job_on_a_machine_without_one(tmp_path, capsys, monkeypatch):
    """Without VEOMNI_OPS_DEVICE, a CUDA job's dry run here plans for a CUDA GPU, saying so (it
    planned for this CPU and said cpu), and a real tune is refused in one line before anything is
    timed (it timed the static plan, which died in its process, and the TuneError escaped as a
    traceback)."""
    monkeypatch.delenv("VEOMNI_OPS_DEVICE", raising=False)
    import veomni_ops.device

    cpu = DeviceInfo("cpu", None, "cpu")
    monkeypatch.setattr(veomni_ops.device, "detected_device", lambda: cpu)
    monkeypatch.setattr(tune.command, "detected_device", lambda: cpu)
    job = write_job(tmp_path, name="gpu.yaml", device="cuda")
    out = tmp_path / "gpu.lock.json"
    assert main(["tune", job, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "tune " + job + ": cuda (the job's train.device cuda), eager mode" in text.splitlines()[0]
    assert main(["tune", job]) == 1
    err = capsys.readouterr().err
    assert err.startswith("veomni-ops tune: veomni-ops tune times kernels on this machine, and the plan's device "
                          "cuda (the job's train.device: cuda) is not this machine's (cpu)"), err
    assert "Traceback" not in err and not out.exists() and not Path(tune.side_path(str(out))).exists()


def test_a_tune_error_is_one_line(tiny_setup, tmp_path, capsys, monkeypatch):
    """A TuneError (the static plan does not train) reaches the user as the CLI's one-line refusal."""
    def fail(*args, **kwargs):
        raise tune.TuneError("the job does not train with its static plan (boom)")

    monkeypatch.setattr(tune.Tuner, "run", fail)
    job = write_job(tmp_path)
    assert main(["tune", job, "--steps", "1"]) == 1
    err = capsys.readouterr().err
    assert err == "veomni-ops tune: the job does not train with its static plan (boom)\n", err


def test_real_tune_on_cpu_and_train_takes_the_lock(tmp_path, capsys):
    # One timed step on a shared CPU is noisy: the tuned plan may measure slower (a warning, printed on stderr).
    """End to end: time every trial of the tiny job (1 warm-up + 1 timed step each), write the lock;
    then ``train`` with it, through ``--lock`` and through the job's ``lock:`` key."""
    job = write_job(tmp_path, lock="tiny.lock.json")
    out = str(tmp_path / "tiny.lock.json")
    # In this process (the default, a process per trial, is timed below: test_process_timer_*).
    assert main(["tune", job, "--steps", "1", "--warmup", "1", "--op", "attention", "--in-process"]) == 0
    captured = capsys.readouterr()
    assert f"plan lock written: {out}" in captured.out and "tune [" in captured.err
    lock = load_lock(out)
    assert [c.op for c in lock.choices] == ["attention"] and lock.method["timed_steps"] == 1
    assert lock.method["trials"] == "every trial in the tune's own process (--in-process)"
    assert set(lock.measurements) >= {"static", "attention/standard:eager@veomni-ops/standard"}
    for key, m in lock.measurements.items():
        assert m["error"] is None and len(m["step_ms"]) == 1 and len(m["losses"]) == 2, key
    assert "refused" not in lock.choices[0].why  # eager and sdpa attention agree in float32
    chosen = lock.choices[0]
    res = train.train_one(train.load_job(job), out=io.StringIO())  # the job's lock: key
    entry = next(e for e in res["plan"]["entries"] if e["op"] == "attention")
    assert (entry["kernel"], entry["reason"]) == (chosen.kernel, f"auto by plan lock {out}: {chosen.why}")
    assert "lock: in" in res["plan"]["lock"]
    other = tmp_path / "other.lock.json"
    dataclasses.replace(lock, mode="compile").save(other)
    assert main(["train", job, "--lock", str(other), "--steps", "1"]) == 1
    err = capsys.readouterr().err
    assert "plan lock" in err and "does not match here: mode: the lock was tuned in compile mode" in err


def test_tune_in_compile_mode_binds_for_compile(tmp_path, monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: compiled.append(m) or m)  # inductor on CPU is slow
    s = tune.setup(train.load_job(write_job(tmp_path, compile=True)))
    assert s.mode == "compile" and s.static_plan.compile
    trial = next(t for t in s.trials() if t.candidate is not None and t.request.op == "attention")
    m = tune.StepTimer(s, steps=1, warmup=1)(trial)
    assert m.ok and len(m.step_ms) == 1 and compiled
    assert trial.lock.mode == "compile"


# ----------------------------------------------------------------------------------------
# a process per trial (ProcessTimer): real children, 1 warm-up + 2 timed steps
# ----------------------------------------------------------------------------------------


def attention_trial(s):
    """The trial of the tiny job's one attention candidate that is not the static choice (eager)."""
    return next(t for t in s.trials() if t.candidate is not None and t.request.op == "attention")


def test_process_timer_trains_as_the_in_process_timer(tmp_path):
    """Same job, seed and data: a trial timed in a process of its own has the in-process trial's
    losses, and it bound the trial's candidate (checked on the child's plan)."""
    s = tune.setup(train.load_job(write_job(tmp_path)))
    trial = attention_trial(s)
    child = tune.ProcessTimer(s, steps=2, warmup=1)(trial)
    assert child.ok, child.error
    here = tune.StepTimer(s, steps=2, warmup=1)(trial)
    assert len(child.losses) == 3 and child.losses == pytest.approx(here.losses, rel=1e-6)
    assert len(child.step_ms) == 2 and all(ms > 0 for ms in child.step_ms) and child.peak_gib is not None
    assert not list(tmp_path.glob("*.partial")) and not (tmp_path / "checkpoints").exists()


def test_process_timer_checks_the_kernel_the_child_bound(tmp_path):
    s = tune.setup(train.load_job(write_job(tmp_path)))
    trial = attention_trial(s)
    wrong = dataclasses.replace(trial, candidate=dataclasses.replace(trial.candidate, kernel="flash"))
    with pytest.raises(tune.TuneError, match="the trial of flash@veomni-ops/standard bound eager@veomni-ops/standard"):
        tune.ProcessTimer(s, steps=1, warmup=0)(wrong)


def test_static_trial_in_a_process_binds_no_lock(tmp_path, monkeypatch, capsys):
    """The static plan's child reads neither the job's ``lock:`` key nor VEOMNI_OPS_LOCK (both name
    an unreadable file here, which ``train`` refuses)."""
    (tmp_path / "bad.lock.json").write_text("{not json")
    job = write_job(tmp_path, lock="bad.lock.json")
    monkeypatch.setenv(ENV_LOCK, str(tmp_path / "bad.lock.json"))
    s = tune.setup(train.load_job(job, here=False))
    m = tune.ProcessTimer(s, steps=2, warmup=1)(tune.Trial("static", False))
    assert m.ok, m.error
    assert len(m.losses) == 3
    assert main(["train", job, "--steps", "1"]) == 1  # what the lock would have done to the trial
    assert "bad.lock.json: cannot be read as JSON" in capsys.readouterr().err


def test_a_failed_trial_process_is_a_failed_measurement_and_the_tune_goes_on(tmp_path):
    """The candidate's child refuses its lock (tuned for compile mode: an explicit lock that does
    not match). Its measurement names the error and ends with the child's last stderr lines (the
    traceback); the tune records it, keeps the static choice and writes the lock."""
    s = tune.setup(train.load_job(write_job(tmp_path)))
    s = dataclasses.replace(s, requests=tuple(r for r in s.requests if r.op == "attention"))
    real = tune.ProcessTimer(s, steps=2, warmup=1)

    def timer(trial):
        if trial.candidate is None:  # the static plan: not what this test is about
            return tune.Measurement([10.0, 10.0], [5.0, 4.0, 3.0])
        return real(dataclasses.replace(trial, lock=dataclasses.replace(trial.lock, mode="compile")))

    stream = io.StringIO()
    lock = tune.Tuner(s, str(tmp_path / "l.json"), timer, stream=stream).run()
    err = lock.measurements[attention_trial(s).key]["error"]
    assert err.startswith("LockMismatchError: plan lock ")
    assert "does not match here: mode: the lock was tuned in compile mode" in err
    tail = err.split(" [its stderr ends: ", 1)[1]
    assert "veomni_ops.lock.LockMismatchError: plan lock" in tail and tail.endswith("]")
    att = lock.choice("attention", ("standard",))
    assert att.kernel == "sdpa" and "refused: LockMismatchError" in att.why
    assert "eager@veomni-ops/standard: failed: LockMismatchError" in stream.getvalue()


@pytest.mark.parametrize("script, error", [
    ("echo 'loading the kernel' >&2\necho 'Fatal Python error: Segmentation fault' >&2\nkill -SEGV $$",
     "the trial's process was killed by signal 11 [its stderr ends: loading the kernel | Fatal Python error: "
     "Segmentation fault]"),
    ("exit 3", "the trial's process exited with status 3 and wrote no result [its stderr was empty]"),
])
def test_a_crashed_trial_process_names_its_end_and_stderr(tiny_setup, tmp_path, script, error):
    """A child that dies without writing its result (a crash in a kernel): an interpreter that does so."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n" + script + "\n")
    python.chmod(0o755)
    m = tune.ProcessTimer(tiny_setup, python=[str(python)])(tune.Trial("static", False))
    assert not m.ok and m.error == error


@pytest.mark.parametrize("flags, built", [((), "ProcessTimer"), (("--in-process",), "StepTimer")])
def test_tune_times_each_trial_in_a_process_unless_in_process(tmp_path, monkeypatch, flags, built):
    made = []

    def factory(name):
        def make(s, steps, warmup):
            made.append((name, steps, warmup))
            return FakeTimer()
        return make

    for name in ("ProcessTimer", "StepTimer"):
        monkeypatch.setattr(tune.command, name, factory(name))
    job = write_job(tmp_path)
    assert main(["tune", job, "--op", "attention", "--steps", "3", *flags]) == 0
    assert made == [(built, 3, 2)]
    assert load_lock(str(tmp_path / "job.lock.json")).method["trials"] == tune.command.WHERE[bool(flags)]


def test_progress_redraws_in_place_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    p = tune.Progress(2, stream)
    p.start(0, "static")
    p.finish(1, "static", "1.00 ms/step")
    text = stream.getvalue()
    assert text.startswith("\r\033[Ktune [") and "timing static ..." in text and text.endswith("1.00 ms/step\n")
