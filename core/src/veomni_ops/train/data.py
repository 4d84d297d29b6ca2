"""The batches of a ``veomni-ops train`` job: the synthetic rows of today (no ``data:`` section),
or packed documents (``data: {packing: true, doc_len: {...}}``).

Packed rows are what TRL's ``padding_free=True`` and transformers' ``DataCollatorWithFlattening``
give a model: several documents one after another in a row of ``train.seq_len`` tokens, no
attention mask, ``position_ids`` that restart at 0 at each document (the attention kernels keep
each document to itself from them), and labels of -100 on each document's first token, so that
no token is predicted across a boundary.

The documents of a step: lengths drawn from a log-normal distribution whose mean, unclipped,
is ``doc_len.mean`` (``sigma``, its shape: 1.0 gives a long tail), rounded and clipped to
``[doc_len.min, doc_len.max]``; the tokens of each an arithmetic progression mod the vocabulary
(a random start and stride), as the unpacked rows. They are laid end to end and cut into the
batch's rows, greedily: a document longer than the room left in its row is split, its rest
starting the next row as a document of its own (positions from 0, its first token not
predicted); what overflows the batch's last row is dropped. Every step draws from a generator
seeded by ``train.seed`` and the step's index alone: every rank draws the same global batch,
and a resumed run's batches are those of a run never stopped without drawing the earlier ones.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from typing import Any

#: The label of a token nothing predicts (a document's first): transformers' ignore_index.
IGNORE_INDEX = -100
#: The data section's fields and their defaults (``doc_len.max`` None: ``train.seq_len``).
DATA_DEFAULTS: dict[str, Any] = {"packing": False, "doc_len": None}
#: ``doc_len``'s fields; None: from the row (max: train.seq_len; min: 16, or less where max or
#: the mean given is; mean: a quarter of the row, within [min, max]).
DOC_LEN_DEFAULTS: dict[str, Any] = {"mean": None, "min": None, "max": None, "sigma": 1.0}
#: What each doc_len field is, for the job's refusals and its report.
DOC_LEN_ABOUT = {"mean": "the mean length of the log-normal before clipping (default: a quarter of train.seq_len)",
                 "min": "the shortest document (default 16, or the mean or max where shorter)", "max": "the longest (default train.seq_len)",
                 "sigma": "the log-normal's shape: larger, a longer tail (default 1.0)"}


def doc_len(data: dict[str, Any] | None, seq_len: int) -> dict[str, Any]:
    """The document lengths of a packing ``data`` section, its defaults filled (:data:`DOC_LEN_DEFAULTS`)."""
    given = (data or {}).get("doc_len") or {}
    out = {**DOC_LEN_DEFAULTS, **{k: v for k, v in given.items() if v is not None}}
    if out["max"] is None:
        out["max"] = seq_len
    if out["min"] is None:  # 16, or less where the row or a given mean is shorter
        out["min"] = min(16, out["max"], *([max(2, int(out["mean"]))] if out["mean"] is not None else []))
    if out["mean"] is None:
        out["mean"] = min(max(out["min"], seq_len / 4), out["max"])
    return out


def packing(job: dict[str, Any]) -> dict[str, Any] | None:
    """The job's packing (``{"doc_len": {mean, min, max, sigma}}``), or None: unpacked rows."""
    data = job.get("data")
    if not data or not data.get("packing"):
        return None
    return {"doc_len": doc_len(data, int(job["train"]["seq_len"]))}


def step_seed(seed: int, step: int) -> int:
    """The seed of step ``step``'s documents (0-based): a function of the two alone."""
    digest = hashlib.sha256(f"veomni-ops packed documents {seed} {step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def packed_batch(vocab: int, batch: int, seq: int, seed: int, step: int, lengths: dict[str, Any]) -> dict[str, Any]:
    """The packed global batch of step ``step`` (0-based): ``input_ids``, ``labels`` and
    ``position_ids``, each ``[batch, seq]`` on the CPU, and ``documents``, the documents (or
    pieces of a split one) of each row."""
    import torch

    g = torch.Generator().manual_seed(step_seed(seed, step))
    need, lo, hi = batch * seq, int(lengths["min"]), int(lengths["max"])
    sigma = float(lengths["sigma"])
    mu = math.log(float(lengths["mean"])) - sigma**2 / 2  # the unclipped mean is doc_len.mean
    chunk = max(16, 2 * need // max(lo, 1))
    drawn: list[torch.Tensor] = []
    total = 0
    while total < need:  # whole chunks, of a size the job fixes: the draws depend on nothing else
        x = torch.empty(chunk, dtype=torch.float64).log_normal_(mu, sigma, generator=g)
        lens = x.round().clamp_(lo, hi).to(torch.long)
        drawn.append(lens)
        total += int(lens.sum())
    lens = torch.cat(drawn)
    n = int((lens.cumsum(0) < need).sum()) + 1  # the documents that fill the batch (the last one cut)
    lens = lens[:n]
    first = torch.randint(0, vocab, (n,), generator=g)
    stride = torch.randint(1, 8, (n,), generator=g)
    doc = torch.repeat_interleave(torch.arange(n), lens)[:need]
    offset = torch.arange(need) - torch.repeat_interleave(lens.cumsum(0) - lens, lens)[:need]
    ids = ((first[doc] + stride[doc] * offset) % vocab).view(batch, seq)
    doc = doc.view(batch, seq)
    starts = torch.ones_like(doc, dtype=torch.bool)
    starts[:, 1:] = doc[:, 1:] != doc[:, :-1]  # a row's first token starts a document (or a split one's rest)
    col = torch.arange(seq).expand(batch, seq)
    position_ids = col - torch.where(starts, col, 0).cummax(dim=1).values
    labels = ids.masked_fill(starts, IGNORE_INDEX)
    return {"input_ids": ids, "labels": labels, "position_ids": position_ids,
            "documents": starts.sum(dim=1).tolist()}


def synthetic_batches(vocab: int, batch: int, seq: int, steps: int, seed: int, device, start: int = 0):
    """Learnable synthetic data: arithmetic progressions mod vocab with a random start and stride.
    ``start``: the batches of steps ``start + 1 .. steps`` only, the same as those of a run from
    step 0 (the earlier ones are drawn and dropped): where a resumed run's data stands."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    for i in range(steps):
        first = torch.randint(0, vocab, (batch, 1), generator=g)
        stride = torch.randint(1, 8, (batch, 1), generator=g)
        if i < start:
            continue
        ids = (first + stride * torch.arange(seq)) % vocab
        yield ids.to(device)


def job_batches(job: dict[str, Any], vocab: int, device, start: int = 0) -> Iterator[dict[str, Any]]:
    """The model inputs of the job's steps ``start + 1 .. steps``: ``input_ids`` and ``labels``
    (and, packed, ``position_ids`` and ``documents``, each row's count). Without packing, the rows
    of :func:`synthetic_batches`, labels the inputs, as ever."""
    t = job["train"]
    steps, b, s, seed = int(t["steps"]), int(t["batch_size"]), int(t["seq_len"]), int(t["seed"])
    pack = packing(job)
    if pack is None:
        for ids in synthetic_batches(vocab, b, s, steps, seed, device, start):
            yield {"input_ids": ids, "labels": ids}
        return
    for i in range(start, steps):
        got = packed_batch(vocab, b, s, seed, i, pack["doc_len"])
        yield {**{k: got[k].to(device) for k in ("input_ids", "labels", "position_ids")},
               "documents": got["documents"]}


def describe(job: dict[str, Any], first: dict[str, Any] | None = None, step: int = 1) -> str | None:
    """The header line of a packed job (None: unpacked); ``first``: the batch of its first step
    (``step``: a resumed run's is later), counted."""
    pack = packing(job)
    if pack is None:
        return None
    d, s = pack["doc_len"], int(job["train"]["seq_len"])
    line = (f"data: packed documents, lengths log-normal (mean {d['mean']}, sigma {d['sigma']}) clipped to "
            f"[{d['min']}, {d['max']}], laid into rows of {s} tokens (a document over a row's end is split; "
            "position_ids restart at each, its first token is not predicted)")
    if first is not None:
        docs = first["documents"]
        line += (f"; step {step}: {sum(docs) / len(docs):.1f} documents per row, mean length "
                 f"{len(docs) * s / sum(docs):.1f} tokens")
    return line


class PackingStats:
    """The documents a run trained on: per row, and their mean length."""

    def __init__(self, seq: int):
        self.seq, self.rows, self.documents = seq, 0, 0

    def add(self, batch: dict[str, Any]) -> None:
        docs = batch.get("documents")
        if docs:
            self.rows += len(docs)
            self.documents += sum(docs)

    def to_dict(self, job: dict[str, Any]) -> dict[str, Any] | None:
        pack = packing(job)
        if pack is None:
            return None
        return {"packing": True, "doc_len": pack["doc_len"], "rows": self.rows, "documents": self.documents,
                "documents_per_row": self.documents / self.rows if self.rows else math.nan,
                "mean_doc_len": self.rows * self.seq / self.documents if self.documents else math.nan}
