"""How the commands word a failure: shared by the CLI and the child process of ``veomni-ops
train`` (which writes its failure for the parent to report)."""

from __future__ import annotations

import os

#: Set to 1 to see the traceback of an unexpected failure of ``veomni-ops train`` (and of
#: every plugin load and hook call: see veomni_ops.discovery).
ENV_TRACE = "VEOMNI_OPS_TRACE"


def error_text(e: BaseException, refusal: bool = True) -> str:
    """One message for ``e``: a refusal's own words; a missing file by its path; anything
    else (an unexpected failure) with its type."""
    if isinstance(e, FileNotFoundError) and e.filename is not None:
        return f"{os.fsdecode(e.filename)}: no such file (looked in {os.getcwd()})"
    if isinstance(e, IsADirectoryError) and e.filename is not None:
        return f"{os.fsdecode(e.filename)}: is a directory, not a file"
    if refusal:
        return str(e)
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
