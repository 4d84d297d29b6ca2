"""The ``veomni-ops`` command: config warnings reach the user, errors are one clear message
(JSON with ``--json``), and planning for another device does not need its vendor packages here."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest
import veomni_ops.discovery
from conftest import make_plugin
from veomni_ops import HardwareRequirement, KernelSpec, build_registry
from veomni_ops.cli import main

ABSENT = "veomni-ops-test-absent-dist>=1"
RESOLVE = importlib.import_module("veomni_ops.resolve")  # the module (veomni_ops.resolve is the function)


def write(tmp_path, text, name="cfg.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.fixture
def needy_registry(monkeypatch):
    """The core's kernels plus a Hopper rms_norm kernel that requires a distribution nobody has."""
    import veomni_ops.backends.reference as reference

    needy = KernelSpec(name="needy", op="rms_norm", variant="standard", factory="math:sqrt", priority=50,
                       hardware=HardwareRequirement(("cuda",), min_capability=(9, 0)), requires=(ABSENT,))
    plugin = make_plugin("needy", rms_norm=[needy])
    plugin.VEOMNI_OPS_PLUGIN_API = ">=1.0,<2"
    reg = build_registry([("eager", reference), ("needy", plugin)],
                         include_entry_points=False, env={})
    monkeypatch.setattr(veomni_ops.discovery, "discover", lambda *a, **k: reg)
    monkeypatch.setattr(importlib.import_module("veomni_ops.resolve.entry"), "discover", lambda *a, **k: reg)
    monkeypatch.delenv("VEOMNI_OPS_DEVICE", raising=False)
    return reg


# ----------------------------------------------------------------------------------------
# config warnings and errors
# ----------------------------------------------------------------------------------------


def test_resolve_prints_legacy_deprecations(tmp_path, capsys):
    cfg = write(tmp_path, "cross_entropy_loss_implementation: chunk_loss\n")
    assert main(["resolve", cfg]) == 0
    err = capsys.readouterr().err
    assert ("veomni-ops resolve: warning: cross_entropy_loss_implementation: 'chunk_loss' is a legacy VeOmni value; "
            "write cross_entropy_loss_implementation: chunked") in err.splitlines()


def test_resolve_lists_unmanaged_fields(tmp_path, capsys):
    cfg = write(tmp_path, "model:\n  ops_implementation:\n    rms_norm_implementation: eager\n"
                          "    causal_conv1d_implementation: fla\n    rms_norm_gated_implementation: fla\n")
    assert main(["resolve", cfg]) == 0
    out, err = capsys.readouterr()
    assert "veomni-ops resolve: warning: ops_implementation: veomni-ops does not manage" in err
    tail = out[out.index("not managed by veomni-ops"):].splitlines()
    assert tail[1].split()[:2] == ["causal_conv1d_implementation", "fla"]
    assert tail[2].split()[:2] == ["rms_norm_gated_implementation", "fla"]
    assert main(["resolve", cfg, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["unmanaged"] == {"causal_conv1d_implementation": "fla", "rms_norm_gated_implementation": "fla"}


def test_resolve_config_errors_all_at_once(tmp_path, capsys):
    cfg = write(tmp_path, "rms_norm_implementation: 3\nfoo_implementation: x\n")
    assert main(["resolve", cfg]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"veomni-ops resolve: {cfg}: 2 problems in ops_implementation:")
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["resolve", "train"])
def test_missing_config_is_named(tmp_path, capsys, command, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([command, "nope.yaml"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"veomni-ops {command}: nope.yaml: no such file (looked in {tmp_path})\n"


@pytest.mark.parametrize("argv,kind", [
    (["resolve", "nope.yaml", "--json"], "ConfigError"),
    (["train", "nope.yaml", "--json"], "FileNotFoundError"),
    (["plugins", "--device", "warp:9", "--json"], "DeviceError"),
])
def test_json_errors_are_json(tmp_path, capsys, monkeypatch, argv, kind):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 1
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["kind"] == kind and data["command"] == argv[0] and data["error"]
    if argv[1] == "nope.yaml":
        assert data["error"] == f"nope.yaml: no such file (looked in {tmp_path})"
    assert err == f"veomni-ops {argv[0]}: {data['error']}\n"  # and in words on stderr, as without --json


def test_json_resolution_error_lists_every_refusal(tmp_path, capsys, needy_registry):
    cfg = write(tmp_path, "rms_norm_implementation: needy\nswiglu_mlp_implementation: nothing_by_this_name\n")
    assert main(["resolve", cfg, "--device", "cpu", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "ResolutionError" and len(data["problems"]) == 2
    assert data["error"].startswith("cannot resolve 2 op(s) for device cpu")


# ----------------------------------------------------------------------------------------
# planning for another device
# ----------------------------------------------------------------------------------------


def test_plan_for_another_device_does_not_need_its_packages_here(tmp_path, capsys, needy_registry):
    cfg = write(tmp_path, "rms_norm_implementation: needy\n")
    assert main(["resolve", cfg, "--device", "cuda:9.0"]) == 0
    out = capsys.readouterr().out
    assert "planned for cuda:9.0 from this cpu machine: no kernel was imported" in out
    assert f"  not checked here: rms_norm/standard needy (needy) requires {ABSENT}" in out.splitlines()
    assert main(["resolve", cfg, "--device", "cuda:9.0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["planned_from"] == "cpu"
    assert data["not_checked"] == [{"op": "rms_norm", "variant": "standard", "kernel": "needy",
                                    "distribution": "needy", "requires": [ABSENT]}]
    # On this machine's own device the requirement is checked, and missing is a refusal.
    assert RESOLVE.requirement_problem(ABSENT) is not None  # not swapped for good
    cpu_cfg = write(tmp_path, "swiglu_mlp_implementation: eager\n", "cpu.yaml")
    assert main(["resolve", cpu_cfg, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["not_checked"] == []


def test_python_resolve_plans_for_another_device_as_the_cli_does(tmp_path, capsys, needy_registry):
    """veomni_ops.resolve(cfg, "cuda:9.0") is the CLI's plan, by the same code: the requirement this
    machine lacks is listed as not checked, not refused; check_requires=True refuses it."""
    cfg = {"rms_norm_implementation": "needy"}
    plan = veomni_ops.resolve(cfg, "cuda:9.0")
    assert plan.get("rms_norm", "standard").kernel == "needy" and plan.get("rms_norm", "standard").fn is None
    assert plan.planned_from == "cpu" and plan.not_checked == (("rms_norm", "standard", (ABSENT,)),)
    assert f"  not checked here: rms_norm/standard needy (needy) requires {ABSENT}" in plan.table().splitlines()
    assert main(["resolve", write(tmp_path, "rms_norm_implementation: needy\n"), "--device", "cuda:9.0",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {**plan.to_dict(), "unmanaged": {}}
    with pytest.raises(veomni_ops.ResolutionError, match="which is not installed"):
        veomni_ops.resolve(cfg, "cuda:9.0", check_requires=True)
    # On this machine's own device the requirement is checked (the kernel is refused for the device first).
    with pytest.raises(veomni_ops.ResolutionError, match="needs a cuda device, this is cpu"):
        veomni_ops.resolve(cfg)
    local = veomni_ops.resolve({"swiglu_mlp_implementation": "eager"}, "cpu")
    assert local.planned_from is None and local.not_checked == () and "planned for" not in local.table()
    # kernel_problem (what `veomni-ops plugins` says per kernel) takes the same defaults.
    (needy,) = [k for k in needy_registry if k.spec.name == "needy"]
    assert RESOLVE.kernel_problem(needy, "cuda:9.0") is None
    assert "which is not installed" in RESOLVE.kernel_problem(needy, "cuda:9.0", check_requires=True)


def test_plugins_for_another_device_says_usable_there(capsys, needy_registry):
    assert main(["plugins", "--device", "cuda:9.0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(line for line in lines if line.split()[:3] == ["op", "variant", "kernel"])
    assert head.rstrip().endswith("usable there (cuda:9.0)") and "usable here" not in head
    row = next(line for line in lines if line.split()[:3] == ["rms_norm", "standard", "needy"])
    assert row.rstrip().endswith(f"yes; not checked here: requires {ABSENT}")
    assert main(["plugins", "--device", "cuda:9.0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (k,) = [k for k in data["kernels"] if k["name"] == "needy"]
    assert k["usable"] and k["not_checked"] == [f"requires {ABSENT}"]


def test_plugins_here_keeps_usable_here_and_checks_requires(capsys, needy_registry):
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(line for line in lines if line.split()[:3] == ["op", "variant", "kernel"])
    assert head.rstrip().endswith("usable here")
    row = next(line for line in lines if line.split()[:3] == ["rms_norm", "standard", "needy"])
    assert "no: needs a cuda device" in row


# ----------------------------------------------------------------------------------------
# train: a failed run is one clear error
# ----------------------------------------------------------------------------------------

JOB = """
model:
  architecture: qwen3
  size: tiny
  config: {num_hidden_layers: 1, hidden_size: 32, intermediate_size: 64, vocab_size: 128,
           num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16}
  ops_implementation: {OPS}
train: {batch_size: 2, seq_len: 8, steps: 2, dtype: float32, device: cpu, seed: 0}
"""


def job(tmp_path, name="job.yaml", ops="{rms_norm_implementation: eager}"):
    return write(tmp_path, JOB.replace("{OPS}", ops), name)


def test_train_unexpected_failure_is_one_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("transformers")
    from veomni_ops import train

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(train.command, "train_one", boom)
    monkeypatch.delenv("VEOMNI_OPS_TRACE", raising=False)
    assert main(["train", job(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == "veomni-ops train: the run failed: RuntimeError: boom (set VEOMNI_OPS_TRACE=1 for the traceback)\n"
    monkeypatch.setenv("VEOMNI_OPS_TRACE", "1")
    assert main(["train", job(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("veomni-ops train: the run failed: RuntimeError: boom\n")


def test_train_child_writes_its_failure_for_the_parent(tmp_path, capsys, monkeypatch):
    pytest.importorskip("transformers")
    from veomni_ops import train

    monkeypatch.setattr(train.command, "train_one", lambda *a, **k: {}["no such key"])
    monkeypatch.delenv("VEOMNI_OPS_TRACE", raising=False)
    result = tmp_path / "result.json"
    assert main(["train", job(tmp_path), "--result-file", str(result)]) == 1
    assert capsys.readouterr().err == ""
    assert json.loads(result.read_text()) == {
        "error": "KeyError: 'no such key' (set VEOMNI_OPS_TRACE=1 for the traceback)", "kind": "KeyError"}


def test_train_compare_failed_child_is_one_error(tmp_path, capfd, monkeypatch):
    """A real child process: its run fails once the model is built (an activation transformers does
    not know: nothing the job's checks can see); the parent says so once."""
    pytest.importorskip("transformers")
    monkeypatch.delenv("VEOMNI_OPS_TRACE", raising=False)
    bad = write(tmp_path, JOB.replace("{OPS}", "{rms_norm_implementation: eager}").replace(
        "head_dim: 16}", "head_dim: 16, hidden_act: no_such_activation}"), "bad.yaml")
    good = job(tmp_path, "good.yaml")
    rc = subprocess.run([sys.executable, "-m", "veomni_ops.cli", "train", bad, "--compare", good],
                        capture_output=True, text=True, env={**os.environ, "VEOMNI_OPS_DEVICE": "cpu"})
    assert rc.returncode == 1, rc.stderr
    errors = [line for line in rc.stderr.splitlines() if line.startswith("veomni-ops train:")]
    assert "Traceback" not in rc.stderr
    assert len(errors) == 1, rc.stderr
    assert errors[0].startswith(f"veomni-ops train: training {bad} failed: KeyError: 'no_such_activation'")


def test_train_refuses_a_kernel_it_cannot_have_before_building_anything(tmp_path, capsys, monkeypatch):
    """A named kernel this machine cannot run is refused when the job is read, with every other
    mistake of the file, before a model is built (flash-attention on a CPU)."""
    pytest.importorskip("transformers")
    from veomni_ops.train import loop

    monkeypatch.setattr(loop, "build_model", lambda *a, **k: pytest.fail("a model was built"))
    bad = job(tmp_path, "bad.yaml", "{attn_implementation: flash_attention_2, rms_norm_implementation: eager}")
    assert main(["train", bad, "--steps", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"veomni-ops train: {bad}: model.ops_implementation: attn_implementation="
                          "'flash_attention_2' (op attention"), err


@pytest.mark.parametrize("defaults", ["auto", "veomni"])
def test_resolve_reports_config_and_resolution_mistakes_together_with_either_defaults(tmp_path, capsys, defaults):
    """A typo'd field and a kernel that cannot run there: one run, one error, with VeOmni's defaults as with ours."""
    path = write(tmp_path, "model:\n  ops_implementation:\n    rms_norm_implmentation: eager\n"
                           "    attn_implementation: flex_attention\n")
    assert main(["resolve", path, "--device", "cpu", "--defaults", defaults, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "ConfigError"
    problems = data["problems"]
    assert problems[0] == ("unknown ops_implementation field 'rms_norm_implmentation'; did you mean "
                           "'rms_norm_implementation'?")
    assert any(p.startswith("attn_implementation='flex_attention'") and "needs a cuda device" in p
               for p in problems[1:]), problems
    if defaults == "veomni":  # the fields the file omits are VeOmni's (GPU) defaults, refused on a CPU as well
        assert any(p.startswith("swiglu_mlp_implementation='liger_kernel'") for p in problems), problems
    else:
        assert len(problems) == 2, problems


@pytest.mark.parametrize("rank", ["0", "1"])
def test_json_error_under_torchrun_is_written_by_rank_0_only(tmp_path, capsys, monkeypatch, rank):
    """The ranks of a torchrun job share stdout: two error documents made it unparsable (GPU run of
    2026-11-26, a failing compiled layout: "Extra data" reading cli-sp2-compile.json)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", rank)
    assert main(["train", "nope.yaml", "--json"]) == 1
    out, err = capsys.readouterr()
    assert (json.loads(out)["kind"] == "FileNotFoundError") if rank == "0" else out == ""
    assert err.startswith("veomni-ops train: nope.yaml: no such file")  # every rank says it in words
