"""The ``data:`` and ``parallel:`` sections of the job YAML (see :mod:`veomni_ops.train.job`):
packed documents and their lengths (:mod:`veomni_ops.train.data`), and the parallel layout."""

from __future__ import annotations

import math
from typing import Any

from .job_schema import DTYPES, _no_value, _not_fields, _unknown


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _load_data(data: dict[str, Any], train: dict[str, Any], problems: list[str]) -> dict[str, Any] | None:
    """data: packed documents (:mod:`veomni_ops.train.data`), every field checked; None without
    the section (the synthetic rows of every job before it), else ``{"packing": bool, "doc_len":
    {...} or None}`` as written (the defaults are filled where the batches are made)."""
    from .data import DATA_DEFAULTS, DOC_LEN_DEFAULTS

    if "data" not in data:
        return None
    section = data["data"]
    if section is None:
        problems.append(_no_value("data", "write {packing: true} (documents packed into rows), or remove the line "
                                  "(unpacked rows)"))
        return None
    if not isinstance(section, dict):
        problems.append(_not_fields("data", section, DATA_DEFAULTS))
        return None
    problems += _unknown(section, tuple(DATA_DEFAULTS), "data field", "data.")
    out = {**DATA_DEFAULTS, **{k: v for k, v in section.items() if k in DATA_DEFAULTS}}
    if "packing" in section and section["packing"] is None:
        problems.append(_no_value("data.packing", "write true (documents packed into rows) or false"))
        out["packing"] = False
    elif not isinstance(out["packing"], bool):
        problems.append(f"data.packing must be true or false, got {out['packing']!r}")
    lengths = out["doc_len"]
    if "doc_len" in section and lengths is None:
        problems.append(_no_value("data.doc_len", "write a mapping (mean, min, max, sigma), or remove the line "
                                  "(the defaults)"))
        return out
    if lengths is None:
        return out
    if not isinstance(lengths, dict):
        problems.append(_not_fields("data.doc_len", lengths, DOC_LEN_DEFAULTS))
        return out
    if out["packing"] is False:
        problems.append("data.doc_len sets the lengths of packed documents, and data.packing is false: set "
                        "packing: true, or remove doc_len")
    problems += _doc_len(lengths, train["seq_len"])
    return out


def _doc_len(lengths: dict[str, Any], seq: Any) -> list[str]:
    """The problems of ``data.doc_len``: its fields, then their ranges (against ``train.seq_len``)."""
    from .data import DOC_LEN_ABOUT, DOC_LEN_DEFAULTS, doc_len

    problems = _unknown(lengths, tuple(DOC_LEN_DEFAULTS), "data.doc_len field", "data.doc_len.")
    for name in (k for k in DOC_LEN_DEFAULTS if k in lengths and lengths[k] is None):
        problems.append(_no_value(f"data.doc_len.{name}", f"write a value, or remove the line ({DOC_LEN_ABOUT[name]})"))
    ok = True
    for name, test, what in (("min", lambda v: _whole(v) and v >= 2,
                              "a whole number of tokens >= 2 (a document's first token is not predicted: one token "
                              "has nothing to learn)"),
                             ("max", lambda v: _whole(v) and v >= 2, "a whole number of tokens >= 2"),
                             ("mean", lambda v: _number(v) and v >= 1, "a number of tokens >= 1"),
                             ("sigma", lambda v: _number(v) and 0 < v <= 4,
                              "a number > 0 and <= 4 (the log-normal's shape; 1.0: a long tail)")):
        value = lengths.get(name)
        if value is not None and not test(value):
            problems.append(f"data.doc_len.{name} must be {what}, got {value!r}")
            ok = False
    if not ok or not (_whole(seq) and seq >= 2):
        return problems  # the ranges below need good values (each mistake is said already)
    given = {k: v for k, v in lengths.items() if k in DOC_LEN_DEFAULTS and v is not None}
    full = doc_len({"doc_len": given}, seq)
    if "max" in given and full["max"] > seq:
        problems.append(f"data.doc_len.max {full['max']} is over train.seq_len {seq}: a document is at most a row; "
                        f"lower max to {seq} or less (or remove it: {seq}), or raise train.seq_len")
    elif "min" in given and full["min"] > full["max"]:
        whose = "data.doc_len.max" if "max" in given else "train.seq_len (doc_len.max by default)"
        problems.append(f"data.doc_len.min {full['min']} is over {whose} {full['max']}: lower min, or raise "
                        f"{'max' if 'max' in given else 'train.seq_len'}")
    elif "mean" in given and not full["min"] <= full["mean"] <= full["max"]:
        problems.append(f"data.doc_len.mean {full['mean']} is outside [min, max] = [{full['min']}, {full['max']}]: "
                        "write a mean between them")
    return problems


def _load_parallel(section: Any, train: dict[str, Any], problems: list[str]):
    """The job's ``parallel:`` layout (:class:`veomni_ops.parallel.ParallelLayout`), or None."""
    if section is None:
        return None
    from ..parallel.layout import ParallelConfigError, ParallelLayout, read_fields

    fields, found = read_fields(section)
    problems += found
    # what the well-formed fields say is checked too, beside the section's own problems
    ranks = ParallelLayout(**{k: v for k, v in fields.items() if k in ("dp_replicate", "dp_shard", "sp")})
    # bfloat16 gradient sums are for a bfloat16 job (float32 master shards, bfloat16 compute); a
    # float32 job asked for float32 numbers, and its gradients would be rounded to bfloat16 to sum
    dtype = train.get("dtype")
    if fields.get("reduce_dtype", "float32") != "float32" and dtype in DTYPES and dtype != "bfloat16":
        found.append(f"parallel.reduce_dtype bfloat16 is for a bfloat16 job, but train.dtype is {dtype}; "
                     "set train.dtype: bfloat16 or remove parallel.reduce_dtype")
        problems.append(found[-1])
    # CUDA graphs (reduce-overhead) around FSDP2's per-step all-gathers are not measured: one process only
    if train.get("compile_mode", "default") != "default" and ranks.world_size > 1:
        problems.append(f"train.compile_mode {train['compile_mode']!r} is for a job of one process; this layout has "
                        f"{ranks.world_size} ranks: remove train.compile_mode (torch.compile's default) or the "
                        "parallel section")
    b = train["batch_size"]
    if isinstance(b, int) and not isinstance(b, bool) and b >= 1:
        try:
            ranks.check_batch(b)
        except ParallelConfigError as e:
            problems.append(str(e))
    return None if found else ParallelLayout(**fields)
