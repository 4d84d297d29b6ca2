"""What a run checks of a checkpoint before it loads it (see :mod:`veomni_ops.train.checkpoint`),
and the rank agreement a save and a load share: the base of
:class:`~veomni_ops.train.checkpoint.Checkpointer`, whose attributes its methods read."""

from __future__ import annotations

import os
from typing import Any

from .checkpoint_files import _digest, _earlier, _os_error
from .errors import CheckpointError, TrainConfigError
from .restart import layout_change


class CheckpointChecks:
    """The checks of a checkpoint against the run that loads it (its data, its files' sizes and
    sha256, its tensors and config, what keeps it from being bitwise), and every rank's say
    (:meth:`_agree`); :class:`~veomni_ops.train.checkpoint.Checkpointer` sets what they read."""

    job: dict[str, Any]
    train: dict[str, Any]
    rt: Any
    rank: int
    kernels: dict[str, str]

    def _data(self, vocab: int) -> dict[str, Any]:
        """The identity of the job's batches (:func:`~veomni_ops.train.data.job_batches`): packed,
        the document lengths too (a checkpoint of unpacked rows has no ``packing``: None)."""
        from .data import packing

        t = self.train
        pack = packing(self.job)
        return {"seed": t["seed"], "batch_size": t["batch_size"], "seq_len": t["seq_len"], "vocab_size": vocab,
                **({"packing": pack["doc_len"]} if pack is not None else {})}

    def _world(self) -> int:
        return self.rt.world_size if self.rt is not None else 1

    def _agree(self, what: str, fix: str, error: str | None, value: Any = None) -> list[Any]:
        """Every rank's ``value`` (a collective, and so a barrier), once every rank said its
        ``error`` (None: none): where any did, a :class:`CheckpointError` on every rank, naming
        each rank's, so that no rank goes on to a collective that the others never reach."""
        if self.rt is None:
            errors, values = [error], [value]
        else:
            import torch.distributed as dist

            both: list[Any] = [None] * self.rt.world_size
            dist.all_gather_object(both, (error, value))
            errors, values = [e for e, _ in both], [v for _, v in both]
        said = [(r, e) for r, e in enumerate(errors) if e is not None]
        if said:
            where = "; ".join(e if self.rt is None else f"rank {r}: {e}" for r, e in said)
            raise CheckpointError(f"{what}: {where}; {fix}")
        return values

    def _not_bitwise(self, info: dict[str, Any]) -> list[str]:
        """What of this run differs from the run that wrote the checkpoint in a way that keeps
        the model but changes the rounding, so that the losses are not bitwise those of a run
        never stopped: the thread count (``train.threads`` set to another), the layout, the plan."""
        import torch

        notes = []
        threads = torch.get_num_threads()
        if isinstance(info.get("threads"), int) and info["threads"] != threads:
            notes.append(f"at {threads} intra-op thread(s), written at {info['threads']} (train.threads): the losses "
                         "differ by rounding from a run never stopped")
        if (moved := layout_change(info.get("layout"), self.rt.layout.to_dict() if self.rt is not None else None)):
            notes.append(moved)
        if isinstance(info.get("plan"), dict) and info["plan"] != self.kernels:
            old, new = info["plan"], self.kernels
            changed = [f"{op}: {old.get(op, '(not bound)')} -> {new.get(op, '(not bound)')}"
                       for op in sorted({*old, *new}) if old.get(op) != new.get(op)]
            notes.append(f"another plan than the checkpoint's ({', '.join(changed)}): the losses differ by rounding "
                         "from a run never stopped")
        return notes

    def _verify_files(self, path: str, info: dict[str, Any]) -> bool:
        """Every file of the checkpoint has the size and sha256 it was written with (each rank
        checks its share; a collective), before DCP reads any: else a :class:`CheckpointError`
        naming each file. False where the checkpoint has no hashes (an earlier veomni-ops)."""
        files = info.get("files")
        if not isinstance(files, dict):
            return False
        problems = []
        for name in sorted(files)[self.rank::self._world()]:
            file, want = os.path.join(path, name), files[name]
            try:
                size = os.path.getsize(file)
                if size != want.get("bytes"):
                    problems.append(f"{name} is {size} bytes, {want.get('bytes')} when written (truncated, or "
                                    "written over)")
                elif _digest(file)["sha256"] != want.get("sha256"):
                    problems.append(f"{name} has another sha256 than when written (altered: a bit flipped on the "
                                    "disk, or in a copy)")
            except FileNotFoundError:
                problems.append(f"{name} is missing")
            except OSError as e:
                problems.append(f"{name} cannot be read ({_os_error(e)})")
        self._agree(f"{path}: the checkpoint is damaged", _earlier(path), "; ".join(problems) or None)
        return True

    def _check_job(self, path: str, info: dict[str, Any], vocab: int) -> None:
        t = self.train
        data = info.get("data") or {}
        ours = {"packing": None, **self._data(vocab)}
        differ = [f"{k} {data.get(k)!r} there, {v!r} here" for k, v in ours.items() if data.get(k) != v]
        if differ:
            raise TrainConfigError(f"{path}: the checkpoint's data differ from this job's ({'; '.join(differ)}): the "
                                   "synthetic batches, and so where the data stands, depend on train.seed, "
                                   "batch_size, seq_len, the vocabulary and the packing (data.packing, doc_len; "
                                   "None: unpacked); resume with the values it was written with, or write a fresh "
                                   "checkpoint_dir")
        if info["step"] >= int(t["steps"]):
            raise TrainConfigError(f"{path}: the checkpoint is at step {info['step']} and train.steps is {t['steps']}: "
                                   "nothing is left to train; raise train.steps (or --steps) to train on")

    def _check_tensors(self, path: str, info: dict[str, Any], meta: dict[str, Any], ours: dict[str, Any],
                       config: list[str]) -> None:
        """Every tensor of this run's model and optimizer is in the checkpoint with its global
        shape, and the checkpoint's model has no tensor this one lacks, and ``config`` (the
        config fields that differ, :func:`config_differences`) is empty: else an error naming the
        model's differences (the optimizer's, where the model's are none) and every such field."""
        def shape(x) -> tuple[int, ...] | None:
            size = getattr(x, "size", None)
            return tuple(size) if size is not None and not callable(size) else None

        parts = []
        for prefix, what in (("model.", "parameters"), ("optim.", "optimizer tensors")):
            mine = {k: v for k, v in ours.items() if k.startswith(prefix)}
            wrong = [f"{k.removeprefix(prefix)} {list(shape(meta[k]) or [])} there, {list(v.shape)} here"
                     for k, v in mine.items() if k in meta and shape(meta[k]) != tuple(v.shape)]
            missing = [k.removeprefix(prefix) for k in mine if k not in meta]
            extra = [k.removeprefix(prefix) for k, v in meta.items()
                     if k.startswith(prefix) and k not in mine and shape(v) is not None]
            for label, names in ((f"{what} of other shapes", wrong), (f"{what} not in the checkpoint", missing),
                                 (f"{what} only in the checkpoint", extra)):
                if names:
                    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
                    parts.append(f"{label}: {', '.join(names[:3])}{more}")
            if parts:
                break
        if config:
            parts.append(f"config fields that differ (the checkpoint's -> this job's): {', '.join(config)}")
        if not parts:
            return
        m = info.get("model") or {}
        written = m.get("config_file") or f"{m.get('architecture')} {m.get('size')}"
        if m.get("overrides"):
            written += f" with config {m['overrides']}"
        raise TrainConfigError(f"{path}: the checkpoint is of another model (written by {written}): "
                               f"{'; '.join(parts)}. Resume with the model it was written for, or train this one into "
                               "a fresh checkpoint_dir")

