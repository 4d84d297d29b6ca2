"""Plan locks and ``veomni-ops tune``: the lock's format, when ``auto`` takes it and when it
refuses it, tuning with an injected timer (deterministic), resuming an interrupted tune, the dry
run, and one real tune of a tiny job on the CPU.

Real training is on a 1-layer Qwen3 of hidden size 32, 2 x 8 tokens, one or two steps a trial.
"""

from __future__ import annotations

import dataclasses
import io
import json
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
        KernelSpec(name="eager", op="rms_norm", variant="standard", factory="math:ceil", priority=0,
                   supports_compile=True),
        KernelSpec(name="hopper", op="rms_norm", variant="standard", factory="math:trunc", priority=0,
                   hardware=HardwareRequirement(("cuda",), min_capability=(9, 0), max_capability=(9, 0))),
    ]
    plugin = make_plugin("toy", rms_norm=specs)
    plugin.VEOMNI_OPS_PLUGIN_API = ">=1.0,<2"  # type: ignore[attr-defined]
    return build_registry([("toy", plugin)], include_entry_points=False, env={})


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

from veomni_ops import train  # noqa: E402
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
