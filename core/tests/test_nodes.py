"""Several nodes (``veomni_ops.parallel.nodes``, ``parallel.dp_replicate``): the layout checks in
this process, then real jobs of 2 "nodes" x 2 processes on this machine: two torchrun launchers
(``--nnodes 2 --node-rank 0/1``, c10d rendezvous on 127.0.0.1), each job compared with the same
job in one process as test_parallel.py compares its layouts (losses, every step's gradients, the
parameters after the last step). Every launcher has a hard timeout: a hang fails the test.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if not torch.distributed.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import parallel_worker as W  # noqa: E402
from test_parallel import _env, _free_port, _scenario, assert_same_as_one_process  # noqa: E402
from veomni_ops.parallel import ParallelConfigError, ParallelLayout  # noqa: E402
from veomni_ops.parallel.nodes import Nodes, check_nodes, node_note  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER = HERE / "parallel_worker.py"
#: both launchers of a job end within this, or the test fails (and kills them)
NODES_TIMEOUT_S = 300


# ----------------------------------------------------------------------------------------
# the layout and the nodes
# ----------------------------------------------------------------------------------------


def test_dp_replicate_multiplies_the_world_and_the_data_parallel_rows():
    lay = ParallelLayout.from_dict({"dp_replicate": 2, "dp_shard": 2, "sp": 2})
    assert (lay.world_size, lay.shard_size, lay.dp_degree) == (8, 4, 4)
    assert lay.to_dict()["dp_replicate"] == 2 and lay.to_dict()["world_size"] == 8
    assert [lay.coords(r)["dp"] for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert lay.sp_group(5) == [4, 5]
    assert "HSDP" in lay.describe() and "dp_replicate 2 x dp_shard 2 x sp 2" in lay.describe()
    with pytest.raises(ParallelConfigError, match=r"dp_replicate 2 x dp_shard 2 x sp 2 = 8 process\(es\), but this "
                                                  r"job runs in 4"):
        lay.check_world(4)
    with pytest.raises(ParallelConfigError, match=r"dp_replicate x dp_shard = 2 x 2 = 4 must divide it"):
        lay.check_batch(2)
    lay.check_batch(4)
    with pytest.raises(ParallelConfigError, match=r"parallel.dp_replicate must be a whole number >= 1, got 0"):
        ParallelLayout.from_dict({"dp_replicate": 0})
    # ep groups are blocks of one replica's ranks
    with pytest.raises(ParallelConfigError, match=r"parallel.ep 4 must divide dp_shard x sp = 1 x 2"):
        ParallelLayout.from_dict({"dp_replicate": 2, "sp": 2, "ep": 4})


def test_nodes_from_torchrun_env():
    assert Nodes.from_env({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2"}) == Nodes(2, 4)
    assert Nodes.from_env({"WORLD_SIZE": "4"}) == Nodes(1, 4)  # no torchrun: one node
    assert Nodes(2, 4).node_of(5) == 1
    with pytest.raises(ParallelConfigError, match="same --nproc-per-node"):
        Nodes.from_env({"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"})
    with pytest.raises(ParallelConfigError, match="GROUP_WORLD_SIZE"):
        Nodes.from_env({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "3"})


def test_a_layout_whose_sp_or_ep_groups_cross_nodes_is_refused_in_one_line():
    nodes = Nodes(2, 2)
    with pytest.raises(ParallelConfigError) as e:
        check_nodes(ParallelLayout(sp=4), nodes)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("parallel: {dp_replicate: 1, dp_shard: 1, sp: 4, ep: 1} puts sp 4 group(s) across nodes")
    assert "2 nodes of 2 processes" in msg and "parallel: {dp_replicate: 2, dp_shard: 1, sp: 2}" in msg
    with pytest.raises(ParallelConfigError, match=r"puts ep 4 group\(s\) across nodes"):
        check_nodes(ParallelLayout(dp_shard=4, ep=4), nodes)
    for ok in (ParallelLayout(dp_replicate=2, sp=2), ParallelLayout(dp_shard=2, sp=2), ParallelLayout(dp_shard=4)):
        check_nodes(ok, nodes)
    check_nodes(ParallelLayout(sp=4), Nodes(1, 4))  # one node: anything goes
    # a shard group across nodes trains (FSDP over the network), and is said, with the fix
    assert "dp_replicate: 2, dp_shard: 2, sp: 1" in (node_note(ParallelLayout(dp_shard=4), nodes) or "")
    assert node_note(ParallelLayout(dp_replicate=2, dp_shard=2), nodes) is None


def test_the_runtime_refuses_it_from_torchruns_environment(monkeypatch):
    from veomni_ops.parallel import ParallelRuntime

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ParallelConfigError, match="across nodes"):
        ParallelRuntime.from_env(ParallelLayout(sp=4), "cpu")
    assert ParallelRuntime.from_env(ParallelLayout(dp_replicate=2, sp=2), "cpu").nodes == Nodes(2, 2)


# ----------------------------------------------------------------------------------------
# 2 nodes x 2 processes, on this machine
# ----------------------------------------------------------------------------------------


def run_nodes(argv: list[str], tmp_path: Path, *, nodes: int = 2, per_node: int = 2, extra: tuple[str, ...] = (),
              env: dict[str, str] | None = None, timeout: float = NODES_TIMEOUT_S) -> list[dict]:
    """``torchrun --nnodes nodes --nproc-per-node per_node --node-rank i ... argv`` for each node,
    all at once, as on a cluster (c10d rendezvous at 127.0.0.1). Per node: rc (None: killed at
    the timeout), output, seconds."""
    endpoint = f"127.0.0.1:{_free_port()}"
    procs = []
    t0 = time.monotonic()
    for i in range(nodes):
        log = open(tmp_path / f"node{i}.log", "w+")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node",
               str(per_node), "--node-rank", str(i), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
               "--rdzv-id", f"veomni-ops-test-{os.getpid()}", *extra, *argv]
        procs.append((subprocess.Popen(cmd, env=env or _env(), stdout=log, stderr=subprocess.STDOUT, cwd=str(HERE),
                                       start_new_session=True), log))
    out = []
    for p, log in procs:
        try:
            rc = p.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for q, _ in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
                    q.wait()
            rc = None
        log.seek(0)
        out.append({"rc": rc, "output": log.read(), "seconds": time.monotonic() - t0})
        log.close()
    return out


def _fmt(results: list[dict]) -> str:
    return "\n".join(f"--- node {i} (exit {x['rc']}, {x['seconds']:.0f} s):\n{x['output'][-5000:]}"
                     for i, x in enumerate(results))


NODES2 = [
    _scenario("hsdp_dense", "qwen3", {"dp_replicate": 2, "dp_shard": 2}, batch=4),
    _scenario("dp2_sp2_dense", "qwen3", {"dp_shard": 2, "sp": 2}),
    _scenario("hsdp_sp2_ep2_moe", "qwen3_moe", {"dp_replicate": 2, "sp": 2, "ep": 2}),
]


@pytest.mark.parallel
def test_two_nodes_of_two_processes_match_one_process(tmp_path):
    spec = tmp_path / "scenarios.json"
    spec.write_text(json.dumps(NODES2))
    results = run_nodes([str(WORKER), str(spec), str(tmp_path)], tmp_path)
    assert all(r["rc"] == 0 for r in results), _fmt(results)
    for sc in NODES2:
        got = torch.load(tmp_path / f"{sc['name']}.pt")
        assert_same_as_one_process(sc, got)
    # HSDP: the dense parameters replicated over dp_replicate, sharded within each node's block; under ep
    # the experts' over (dp_replicate, the ranks owning the same experts); without dp_replicate plain FSDP2
    hsdp = torch.load(tmp_path / "hsdp_dense.pt")["meshes"]["model.embed_tokens.weight"]
    assert hsdp == {"shape": (2, 2), "dims": ("dp_replicate", "fsdp"), "placements": ["R", "S(0)"]}, hsdp
    flat = torch.load(tmp_path / "dp2_sp2_dense.pt")["meshes"]["model.embed_tokens.weight"]
    assert flat["shape"] == (4,) and flat["placements"] == ["S(0)"], flat
    moe = torch.load(tmp_path / "hsdp_sp2_ep2_moe.pt")["meshes"]
    experts = next(v for k, v in moe.items() if k.endswith("experts.gate_up_proj"))
    assert experts["dims"] == ("dp_replicate", "edp") and experts["shape"] == (2, 1), experts
    text = results[0]["output"]
    assert "HSDP: dense parameters sharded within each block of 2 consecutive ranks" in text, _fmt(results)


@pytest.mark.parallel
def test_two_nodes_train_command_with_hsdp_and_ep_gives_the_one_process_losses(tmp_path):
    """``veomni-ops train`` itself on 2 nodes x 2 processes (``dp_replicate: 2, dp_shard: 2, ep: 2``),
    as the README's multi-node command runs it, with checkpoints: its losses are the one-process
    ones, its checkpoint records the layout and resumes in one process (the experts, written as
    their part of all of them over the (ep, dp_replicate, edp) ranks, land where they belong).
    Then a layout whose sp group would cross the nodes: refused on every rank before any
    collective, in one line naming the fix."""
    import yaml
    from veomni_ops import train

    job = {"model": {"architecture": "qwen3_moe", "size": "tiny",
                     "config": {k: v for k, v in W.TINY.items() if k != "num_hidden_layers"}},
           "train": {"batch_size": 4, "seq_len": 15, "steps": 3, "lr": 1e-3, "dtype": "float32", "device": "cpu",
                     "seed": 0}}
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump(job))
    par = tmp_path / "hsdp.yaml"
    par.write_text(yaml.safe_dump({**job, "parallel": {"dp_replicate": 2, "dp_shard": 2, "ep": 2, "timeout_s": 120},
                                   "train": {**job["train"], "checkpoint_dir": "ckpt", "checkpoint_every": 2}}))
    results = run_nodes(["-m", "veomni_ops.cli", "train", str(par), "--result-file", str(tmp_path / "hsdp.json")],
                        tmp_path)
    assert all(r["rc"] == 0 for r in results), _fmt(results)
    got = json.loads((tmp_path / "hsdp.json").read_text())
    assert got["parallel"]["dp_replicate"] == 2 and got["parallel"]["world_size"] == 4 and got["parallel"]["ep"] == 2
    ref = train.train_one(train.load_job(str(one)), out=open(os.devnull, "w"))
    for a, b in zip(got["losses"], ref["losses"], strict=True):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (got["losses"], ref["losses"])
    ckpt = tmp_path / "ckpt" / "step-00000002"
    info = json.loads((ckpt / "veomni_ops.json").read_text())
    assert info["layout"]["dp_replicate"] == 2 and info["world_size"] == 4
    resumed = train.load_job(str(one))
    resumed["train"].update(resume=str(ckpt))
    said = io.StringIO()
    again = train.train_one(resumed, out=said)
    assert again["first_step"] == 3
    assert ("another layout than the checkpoint's (dp_replicate 2 -> 1, dp_shard 2 -> 1, ep 2 -> 1): the losses "
            "differ by rounding") in said.getvalue(), said.getvalue()
    assert abs(again["losses"][2] - got["losses"][2]) <= 1e-5 * max(1.0, abs(got["losses"][2])), (again, got)
    wide = tmp_path / "wide.yaml"
    wide.write_text(yaml.safe_dump({**job, "parallel": {"sp": 4, "timeout_s": 60}}))
    results = run_nodes(["-m", "veomni_ops.cli", "train", str(wide), "--result-file", str(tmp_path / "wide.json")],
                        tmp_path, timeout=180)
    assert all(r["rc"] not in (0, None) for r in results), _fmt(results)
    error = json.loads((tmp_path / "wide.json").read_text())["error"]
    assert "parallel: {dp_replicate: 1, dp_shard: 1, sp: 4, ep: 1} puts sp 4 group(s) across nodes" in error, error
    assert "parallel: {dp_replicate: 2, dp_shard: 1, sp: 2}" in error, error
