"""Sharded checkpoints of a ``veomni-ops train`` job, with PyTorch's own
``torch.distributed.checkpoint`` (DCP), and resuming from them.

    train:
      checkpoint_dir: ckpt     # one folder per checkpoint: ckpt/step-00000004/ (relative: to the YAML's folder)
      checkpoint_every: 100    # every N steps, and at the last step; 0 (the default): at the last step only
      resume: true             # the latest complete checkpoint in checkpoint_dir (an error if there is none);
                               # auto: the same, or from step 0 where there is none; PATH: that checkpoint
                               # (or the latest in that folder); false (the default): from step 0

(``veomni-ops train JOB --resume`` is ``resume: true``; ``--resume PATH`` is ``resume: PATH``.)

**What a checkpoint holds.** The model and the optimizer as
``torch.distributed.checkpoint.state_dict.get_state_dict`` gives them: under a layout each rank's
FSDP2 shards (DTensors), each written by the rank that holds it; in one process the whole
tensors. The optimizer state (AdamW's moments and step) is keyed by parameter name
(``flatten_optimizer_state_dict``), so it does not depend on how the parameters are grouped.
Every rank's RNG state (torch's CPU generator, and the CUDA generator of its GPU where it trains
on one). And, in ``veomni_ops.json`` (rank 0): the step, the losses so far, the data position's
identity (the synthetic batches, :func:`~veomni_ops.train.data.job_batches`, are a
function of ``train.seed``, ``batch_size``, ``seq_len``, the vocabulary and the packing's
document lengths (``data:``): the position is the
step), the model and layout it was written by, and versions. And what decides whether a resumed
run's losses are bitwise those of a run never stopped: the intra-op thread count (torch's CPU
float32 sums, split over threads, round otherwise; a resumed job with ``train.threads: auto``
takes the checkpoint's), every field of the model's transformers config (:func:`config_fingerprint`)
and the kernel bound for each op (:func:`plan_fingerprint`). And the size and sha256 of every
file of the checkpoint.

**Complete or absent.** Every rank writes into ``step-N.partial/``; once DCP has written its
``.metadata`` (after every rank's data), the ranks hash the files (each its share), rank 0
writes ``veomni_ops.json`` with the hashes, renames the folder to ``step-N`` (one atomic
rename) and every rank waits for that. A run killed mid-save leaves a ``.partial`` folder,
which resuming never picks and the next save of that step replaces. A save the disk refuses
(DCP's ``CheckpointException``, or an ``OSError`` of ours) is a :class:`CheckpointError` on
every rank, naming the checkpoint, the rank and the file; the folder itself is tried (made and
written into) when the job is read, before step 1.

**Resuming.** Every file of the checkpoint is checked against the size and sha256 it was
written with (each rank its share), before anything is read: a missing, truncated or altered
file is refused, naming it. A checkpoint of an earlier veomni-ops, without hashes, is read with
a warning that its files are not verified. The model and optimizer are built as for a fresh
run, then checked against the checkpoint: every field of the model's config and every
parameter's and optimizer tensor's name and global shape (a checkpoint of another model is
refused, naming each difference), the data's identity, and that steps are left. Another plan
(another kernel for an op), another thread count or another layout is accepted and said: the
losses then differ by rounding from those of a run never stopped. DCP then reads each rank's
part, whatever layout wrote it (written under ``dp_shard: 2``, read in one process, or the
reverse). The data continues at the next batch, the RNG states are
restored (a rank the checkpoint has none for, when there are more ranks than wrote it, takes
rank 0's: a fresh job seeds every rank alike too), the job's ``train.lr`` applies, and the run
reports the whole loss curve: the checkpoint's losses, then its own.

Under ``parallel.ep > 1`` each rank holds ``E / ep`` experts (FSDP2-sharded over the ranks that
own the same ones), a DTensor of that slice only: the checkpoint writes it as its part of all
``E`` experts (:meth:`Checkpointer._whole_experts`), so that DCP places it, and an expert
checkpoint loads under another ``ep`` or in one process, and the reverse.

Not yet: keeping only the last N checkpoints (every one is kept).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

from .checkpoint_checks import CheckpointChecks
from .checkpoint_files import (  # noqa: F401  (re-exported: the files of a checkpoint live there)
    _NAME,
    DCP_METADATA,
    FORMAT,
    INFO,
    PARTIAL,
    _commit,
    _digest,
    _earlier,
    _failures,
    _os_error,
    _partials,
    _write_json,
    _yaml,
    checkpoint_name,
    complete_checkpoints,
    find_resume,
    is_complete,
    read_info,
)
from .checkpoint_fingerprint import (  # noqa: F401  (re-exported)
    CONFIG_FIELDS_IGNORED,
    _flat,
    config_differences,
    config_fingerprint,
    plan_fingerprint,
)
from .errors import CheckpointError, TrainConfigError  # noqa: F401  (TrainConfigError: re-exported)


class Checkpointer(CheckpointChecks):
    """Saves and loads the checkpoints of one run (this rank's part of them): ``model`` and
    ``opt`` as built for the run on ``device``, ``rt`` its parallel runtime (None: one process)."""

    def __init__(self, job: dict[str, Any], model, opt, device: str, rt=None, out=sys.stderr,
                 kernels: dict[str, str] | None = None):
        t = job["train"]
        self.job, self.train = job, t
        self.directory: str | None = t.get("checkpoint_dir")
        self.every = int(t.get("checkpoint_every") or 0)
        self.model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the names are the model's
        self.opt, self.rt, self.out = opt, rt, out
        self.rank = rt.rank if rt is not None else 0
        self.device = str(device)
        self._mesh = None  # the (ep, edp) mesh of the experts, made on first use (ep > 1)
        self.config = config_fingerprint(self.model.config)
        #: the kernel bound for each op (:func:`plan_fingerprint`)
        self.kernels = dict(kernels or {})

    # -- what it holds -------------------------------------------------------------------------
    def _options(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(flatten_optimizer_state_dict=True)

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        return get_state_dict(self.model, self.opt, options=self._options())

    def _whole_experts(self, state: dict[str, Any], key) -> dict[str, Any]:
        """``state`` with every expert tensor of this rank (``ep > 1``: its FSDP2 shard, over the
        ranks that own the same experts, of its ``E / ep`` experts) as its part of the whole
        ``E`` experts: a DTensor over the ranks as an (ep, edp) mesh, sharded on the experts by
        both (ep outer: expert group rank j owns experts [j E/ep, (j+1) E/ep)), sharing the
        storage. DCP then places it (and another layout reads it) like any other shard."""
        names = self.rt.expert_params if self.rt is not None else frozenset()
        if not names:
            return state
        import torch
        from torch.distributed.tensor import DTensor, Replicate, Shard

        mesh = self._expert_mesh()
        out = dict(state)
        places = [Shard(0), *([Replicate()] if mesh.ndim == 3 else []), Shard(0)]  # HSDP: replicated over dp_replicate
        for k, v in state.items():
            if key(k) in names and isinstance(v, DTensor):
                shape = torch.Size((v.shape[0] * self.rt.layout.ep, *v.shape[1:]))
                out[k] = DTensor.from_local(v.to_local(), mesh, places, run_check=False, shape=shape,
                                            stride=torch.empty(shape, device="meta").stride())
        return out

    def _expert_mesh(self):
        if self._mesh is None:
            import torch
            from torch.distributed.device_mesh import DeviceMesh

            ep, world, rep = self.rt.layout.ep, self.rt.world_size, self.rt.layout.dp_replicate
            ranks = torch.arange(world).reshape(rep, world // rep // ep, ep).permute(2, 0, 1)  # [ep, replica, edp]
            kind = "cuda" if self.device.startswith("cuda") else "cpu"
            names = ("ep", "dp_replicate", "edp") if rep > 1 else ("ep", "edp")
            self._mesh = DeviceMesh(kind, ranks if rep > 1 else ranks[:, 0], mesh_dim_names=names)
        return self._mesh

    def _sharded_state(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(model, optimizer) state dicts as the model and optimizer take them, and as DCP
        writes and reads them (the same, but for the experts: :meth:`_whole_experts`)."""
        msd, osd = self._state()
        return (msd, osd, self._whole_experts(msd, lambda k: k),
                self._whole_experts(osd, lambda k: k.removeprefix("state.").rpartition(".")[0]))

    def _rng(self) -> dict[str, Any]:
        import torch

        state = {"cpu": torch.get_rng_state()}
        if self.device.startswith("cuda"):
            state["cuda"] = torch.cuda.get_rng_state(torch.device(self.device))
        return state

    def info(self, step: int, losses: list[float], vocab: int) -> dict[str, Any]:
        """What ``veomni_ops.json`` holds, but for the files' hashes (:meth:`save` adds them)."""
        import torch

        from .. import __version__

        t, job = self.train, self.job
        layout = self.rt.layout.to_dict() if self.rt is not None else None
        return {
            "format": FORMAT, "step": step, "losses": list(losses),
            "data": self._data(vocab),
            "model": {"architecture": job.get("architecture"), "size": job.get("size"),
                      "config_file": job.get("config_file"), "overrides": job.get("overrides") or {},
                      "dtype": t["dtype"]},
            "config": self.config, "plan": self.kernels, "threads": torch.get_num_threads(),
            "layout": layout, "world_size": self.rt.world_size if self.rt is not None else 1,
            "versions": {"torch": torch.__version__, "veomni_ops": __version__},
            "job": job.get("path"), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    # -- saving --------------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """Is a checkpoint written after ``step`` (every N steps, and the last)?"""
        return self.directory is not None and (step == int(self.train["steps"]) or
                                               (self.every > 0 and step % self.every == 0))

    def save(self, step: int, losses: list[float], vocab: int) -> str:
        """Write the checkpoint of ``step`` (a collective: every rank calls it). Returns its path.
        A write the disk refuses, on any rank, is a :class:`CheckpointError` on every rank."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        assert self.directory is not None
        t0 = time.perf_counter()
        final = os.path.join(self.directory, checkpoint_name(step))
        tmp = final + PARTIAL
        what = f"cannot write the checkpoint of step {step} ({final})"
        fix = (f"make train.checkpoint_dir {self.directory} writable, with room for a checkpoint (its owner, "
               "permissions, disk space), or name another folder; then resume (--resume: from the latest complete "
               "checkpoint there, none of which this save touched)")
        error = None
        if self.rank == 0:
            try:
                os.makedirs(self.directory, exist_ok=True)
                shutil.rmtree(tmp, ignore_errors=True)  # a save of this step that a killed run left half-written
            except OSError as e:
                error = _os_error(e)
        self._agree(what, fix, error)  # the barrier before DCP's save
        _, _, msd, osd = self._sharded_state()
        try:
            with self._dcp():
                dcp.save({"model": msd, "optim": osd, "rng": {f"rank{self.rank}": self._rng()}}, checkpoint_id=tmp,
                         no_dist=self.rt is None)
        except CheckpointException as e:  # a BaseException: it would pass every `except Exception`
            raise CheckpointError(f"{what}: {_failures(e)}; {fix}") from None
        # DCP's .metadata is written: every rank's data is. Each rank hashes its share of the files.
        names = sorted(n for n in os.listdir(tmp) if n != INFO)
        digests: dict[str, dict[str, Any]] = {}
        error = None
        try:
            for name in names[self.rank::self._world()]:
                digests[name] = _digest(os.path.join(tmp, name))
        except OSError as e:
            error = _os_error(e)
        files: dict[str, dict[str, Any]] = {}
        for part in self._agree(what, fix, error, digests):
            files.update(part)
        error = None
        if self.rank == 0:
            try:
                _write_json(os.path.join(tmp, INFO), {**self.info(step, losses, vocab), "files": files})
                _commit(tmp, final)
            except OSError as e:
                error = _os_error(e)
        self._agree(what, fix, error)  # every rank waits for the commit
        print(f"checkpoint: step {step} -> {final} ({time.perf_counter() - t0:.2f} s)", file=self.out, flush=True)
        return final

    @contextlib.contextmanager
    def _dcp(self) -> Iterator[None]:
        """Around a DCP call: in one process DCP warns that it assumes one process, which is meant."""
        with warnings.catch_warnings():
            if self.rt is None:
                warnings.filterwarnings("ignore", message="torch.distributed is .*single process")
            yield

    # -- loading -------------------------------------------------------------------------------
    def load(self, path: str, vocab: int) -> tuple[int, list[float]]:
        """Load the checkpoint at ``path`` into the model, optimizer and RNG (a collective).
        Returns (its step, its losses)."""
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import set_state_dict

        info = read_info(path)
        self._check_job(path, info, vocab)
        verified = self._verify_files(path, info)
        msd, osd, whole_msd, whole_osd = self._sharded_state()
        try:
            meta = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        except Exception as e:  # unpickling a damaged file fails in many ways; each is this one refusal
            raise CheckpointError(f"{path}: cannot read DCP's {DCP_METADATA} ({type(e).__name__}: {e}): the "
                                  f"checkpoint is damaged; {_earlier(path)}") from None
        self._check_tensors(path, info, meta, {**_prefixed("model", whole_msd), **_prefixed("optim", whole_osd)},
                            config_differences(info.get("config"), self.config))
        who = f"rank{self.rank}" if f"rng.rank{self.rank}.cpu" in meta else "rank0"
        mine = self._rng()
        rng = {k: torch.empty(tuple(meta[f"rng.{who}.{k}"].size), dtype=torch.uint8)  # type: ignore[union-attr]
               for k in mine if f"rng.{who}.{k}" in meta}
        try:
            with self._dcp():
                dcp.load({"model": whole_msd, "optim": whole_osd, "rng": {who: rng}}, checkpoint_id=path,
                         no_dist=self.rt is None)
        except CheckpointException as e:  # a BaseException: it would pass every `except Exception`
            damaged = "" if verified else " (its files were not verified: it has no hashes)"
            raise CheckpointError(f"{path}: cannot read the checkpoint{damaged}: {_failures(e)}; "
                                  f"{_earlier(path)}") from None
        # DCP loaded tensors in place (the experts' views share their storage) and values (the
        # optimizer's hyperparameters) into the dicts it was given: take those, with the tensors
        # the model and optimizer have
        set_state_dict(self.model, self.opt, model_state_dict=_unviewed(whole_msd, msd),
                       optim_state_dict=_unviewed(whole_osd, osd), options=self._options())
        for group in self.opt.param_groups:  # the job's hyperparameters, the checkpoint's state
            group["lr"] = float(self.train["lr"])
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"], torch.device(self.device))
        step, losses = int(info["step"]), [float(x) for x in info.get("losses", [])]
        written = (info.get("model") or {}).get("dtype")
        notes = [f"written by {info['world_size']} process(es)"] if info.get("world_size") else []
        if written and written != self.train["dtype"]:
            notes.append(f"written in {written}, cast to {self.train['dtype']}")
        notes += self._not_bitwise(info)
        print(f"resumed: step {step} <- {path}" + (f" ({'; '.join(notes)})" if notes else ""), file=self.out,
              flush=True)
        missing = [what for key, what in (("files", "no hashes: its files are not verified"),
                                          ("config", "no config fingerprint: only its tensors' names and shapes are "
                                                     "checked against this model"),
                                          ("threads", "no thread count"), ("plan", "no plan")) if key not in info]
        if missing:
            print(f"warning: {path} was written by an earlier veomni-ops ({info.get('versions', {}).get('veomni_ops')})"
                  f": {'; '.join(missing)}. The next checkpoint this run writes has them", file=self.out, flush=True)
        return step, losses


def _unviewed(loaded: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """``loaded``, with the model's (or optimizer's) own tensor where it held a view of it."""
    return {k: own[k] if v is not own[k] and hasattr(own[k], "shape") else v for k, v in loaded.items()}


def _prefixed(prefix: str, state: dict[str, Any]) -> dict[str, Any]:
    """The tensors of ``state`` under the keys DCP stores them by (``prefix.key``; nested dicts flattened)."""
    out: dict[str, Any] = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out.update(_prefixed(f"{prefix}.{k}", v))
        elif hasattr(v, "shape"):
            out[f"{prefix}.{k}"] = v
    return out
