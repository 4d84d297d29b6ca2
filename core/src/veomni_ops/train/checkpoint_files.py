"""The files of a checkpoint on disk (see :mod:`veomni_ops.train.checkpoint` for the format):
their names (``step-N``, ``.partial``), whether a save finished, which checkpoint ``train.resume``
names, ``veomni_ops.json`` read and written, each file's size and SHA-256, the atomic rename that
completes a save, and the wording of what the disk refused."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from typing import Any

from .errors import TrainConfigError

#: the file of a checkpoint that says what wrote it (rank 0 writes it last, before the rename)
INFO = "veomni_ops.json"


#: DCP's own file, written once every rank's data is
DCP_METADATA = ".metadata"


PARTIAL = ".partial"


FORMAT = 1


_NAME = re.compile(r"^step-(\d{8,})$")


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def is_complete(path: str) -> bool:
    """Is ``path`` a checkpoint whose save finished (named step-N, DCP's metadata and ours in it)?"""
    return (_NAME.match(os.path.basename(os.path.normpath(path))) is not None
            and os.path.isfile(os.path.join(path, DCP_METADATA)) and os.path.isfile(os.path.join(path, INFO)))


def complete_checkpoints(directory: str) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint in ``directory``, by step."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        m = _NAME.match(name)
        path = os.path.join(directory, name)
        if m and is_complete(path):
            found.append((int(m.group(1)), path))
    return sorted(found)


def find_resume(train: dict[str, Any]) -> str | None:
    """The checkpoint the job's ``train.resume`` names (checked fields, paths absolute), or None
    (start from step 0). Raises :class:`TrainConfigError` where it names none."""
    value = train.get("resume", False)
    if value is False or value is None:
        return None
    if value is True or value == "auto":
        directory = train.get("checkpoint_dir")
        if not directory:
            raise TrainConfigError(f"train.resume: {_yaml(value)} resumes from the latest checkpoint in "
                                   "train.checkpoint_dir, which is not set: set checkpoint_dir, or give resume: PATH "
                                   "of a checkpoint")
        found = complete_checkpoints(directory)
        if found:
            return found[-1][1]
        if value == "auto":
            return None
        raise TrainConfigError(f"train.resume: true, but {directory} holds no complete checkpoint (a step-N folder "
                               f"with {DCP_METADATA} and {INFO}){_partials(directory)}: train without resume to "
                               "write the first (resume: auto resumes where there is one and starts from step 0 "
                               "where there is none), or point resume: at a checkpoint")
    path = str(value)
    if is_complete(path):
        return path
    if os.path.isdir(path):
        found = complete_checkpoints(path)
        if found:
            return found[-1][1]
        if path.endswith(PARTIAL) or os.path.isfile(os.path.join(path, DCP_METADATA)):
            raise TrainConfigError(f"train.resume: {path} is an incomplete checkpoint (its save was interrupted, or "
                                   f"it lacks {INFO}): resume from an earlier one")
        raise TrainConfigError(f"train.resume: {path} is neither a checkpoint nor a folder of checkpoints (step-N "
                               f"folders){_partials(path)}: give the path of one, or a checkpoint_dir")
    raise TrainConfigError(f"train.resume: {path} does not exist: give the path of a checkpoint (a step-N folder) or "
                           "of a checkpoint_dir")


def _yaml(value: Any) -> str:
    return "true" if value is True else str(value)


def _partials(directory: str) -> str:
    try:
        half = sorted(n for n in os.listdir(directory) if n.endswith(PARTIAL))
    except OSError:
        return ""
    return f"; {', '.join(half)} is an interrupted save, never resumed from" if half else ""


def read_info(path: str) -> dict[str, Any]:
    """The ``veomni_ops.json`` of the checkpoint at ``path``."""
    file = os.path.join(path, INFO)
    try:
        with open(file) as fh:
            info = json.load(fh)
    except (OSError, ValueError) as e:
        raise TrainConfigError(f"{path}: cannot read {INFO} ({e}): not a checkpoint of veomni-ops train, or a "
                               "damaged one; resume from another") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT or not isinstance(info.get("step"), int):
        raise TrainConfigError(f"{file}: not a checkpoint of this veomni-ops (format {FORMAT}); resume from one this "
                               "version wrote")
    return info


def _write_json(path: str, data: dict[str, Any]) -> None:
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())


def _commit(tmp: str, final: str) -> None:
    """Make the written checkpoint ``tmp`` the checkpoint ``final``: one rename (an older
    ``final``, from a run that went further before, is moved aside first and then removed)."""
    old = final + ".old"
    if os.path.exists(final):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    try:  # the rename itself on disk
        fd = os.open(os.path.dirname(final) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _digest(path: str) -> dict[str, Any]:
    """The size and sha256 of the file at ``path``, as ``veomni_ops.json`` keeps them."""
    with open(path, "rb") as fh:
        return {"bytes": os.fstat(fh.fileno()).st_size, "sha256": hashlib.file_digest(fh, "sha256").hexdigest()}


def _os_error(e: OSError) -> str:
    text = f"{type(e).__name__}: {e.strerror or e}"
    return text + (f": {os.fsdecode(e.filename)}" if e.filename else "")


def _failures(e: BaseException) -> str:
    """What DCP's ``CheckpointException`` ``e`` says failed: each rank's exception (an OSError
    with the file it names)."""
    failures = getattr(e, "failures", None) or {}
    parts = []
    for rank, (exc, _) in sorted(failures.items()):
        text = _os_error(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
        parts.append(f"rank {rank}: {text}")
    return "; ".join(parts) or str(e)


def _earlier(path: str) -> str:
    """The fix for a checkpoint that cannot be read: an earlier one of its folder, where there is one."""
    path = os.path.normpath(path)
    m = _NAME.match(os.path.basename(path))
    earlier = [p for s, p in complete_checkpoints(os.path.dirname(path)) if m and s < int(m.group(1))]
    if earlier:
        return (f"resume from an earlier checkpoint (--resume {earlier[-1]}, or train.resume: that path), or copy "
                "this one again from where it came from")
    return ("copy it again from where it came from, or train from step 0 (without resume) into a fresh "
            "checkpoint_dir")
