"""The errors of ``veomni-ops train`` (a module of their own: the job reader and the checkpoint
code both raise them, and neither imports the other for it)."""

from __future__ import annotations


class TrainConfigError(ValueError):
    """A job YAML or a train option is malformed or cannot run here (the CLI reports it and exits 1).
    ``problems`` lists every mistake found in the job (the message has them all)."""

    def __init__(self, message: str, problems: list[str] | tuple[str, ...] | None = None):
        super().__init__(message)
        self.problems: tuple[str, ...] = tuple(problems) if problems is not None else (message,)


class CheckpointError(TrainConfigError):
    """A checkpoint cannot be written or read: the disk refused (permissions, space), or a file
    of it is missing, truncated or altered. The message names the checkpoint, the rank and file
    where known, and the fix; the CLI reports it as a refusal (``--json``: ``{"error", "kind"}``)."""


class RunFailed(RuntimeError):
    """A training run in a child process failed (its output is above)."""
