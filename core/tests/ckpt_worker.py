"""``veomni-ops train`` in this process, killed hard at a checkpoint (test_checkpoint.py starts
it: alone, or as each rank of a job as torchrun would).

    python ckpt_worker.py RESULT.json KILL -- TRAIN-ARGS...

Runs ``veomni-ops train TRAIN-ARGS... --json`` and writes what it printed on stdout (rank 0's
result) to RESULT.json. KILL is ``none``; ``after:K``, ``os._exit(9)`` on every rank as soon as
the checkpoint of step K is complete (the process dies as under SIGKILL: no cleanup, no
``finally``); or ``during:K``, rank 0 exits the same way in the middle of saving step K: every
rank's data and DCP's metadata are written, the checkpoint not yet committed.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys

from veomni_ops.cli import main
from veomni_ops.train import checkpoint


def arm(kill: str) -> None:
    if kill == "none":
        return
    when, _, k = kill.partition(":")
    step = int(k)
    if when == "after":
        save = checkpoint.Checkpointer.save

        def save_then_die(self, at, *args, **kwargs):
            path = save(self, at, *args, **kwargs)
            if at == step:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(9)
            return path

        checkpoint.Checkpointer.save = save_then_die  # type: ignore[method-assign]
    elif when == "during":
        commit = checkpoint._commit

        def die_before_commit(tmp, final):
            if final.endswith(checkpoint.checkpoint_name(step)):
                sys.stderr.flush()
                os._exit(9)
            commit(tmp, final)

        checkpoint._commit = die_before_commit
    else:
        raise SystemExit(f"KILL must be none, after:K or during:K, not {kill!r}")


if __name__ == "__main__":
    result, kill, sep, *args = sys.argv[1:]
    assert sep == "--", sys.argv
    arm(kill)
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        rc = main(["train", *args, "--json"])
    if int(os.environ.get("RANK", "0")) == 0:
        with open(result, "w") as fh:
            fh.write(text.getvalue())
    sys.stdout.flush()
    sys.stderr.flush()
    # as parallel_worker: torch 2.13's gloo teardown can abort a finished rank in interpreter finalisation
    os._exit(rc)
