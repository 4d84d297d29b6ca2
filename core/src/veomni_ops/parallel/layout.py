"""``ParallelLayout``: the ``parallel:`` section of a job, validated. Imports no torch.

    parallel: {dp_replicate: 2, dp_shard: 2, sp: 2, ep: 2, ep_chunks: 1, timeout_s: 600}

Ranks form a ``dp_shard x sp`` grid with ``sp`` innermost: rank ``= dp * sp + s`` (so the
ranks of one sequence-parallel group are neighbours: on GPUs, one node's NVLink). Every
process holds ``batch_size / dp_shard`` rows of the global batch and ``1 / sp`` of their
sequence. ``dp_shard x sp`` must equal the number of processes.

``dp_replicate`` (HSDP, default 1) repeats that grid: ranks form ``dp_replicate x dp_shard x sp``
with ``sp`` innermost (rank ``= (r * dp_shard + d) * sp + s``); FSDP2 shards the parameters
within each block of ``dp_shard x sp`` consecutive ranks and replicates them across the blocks
(gradients all-reduced between them), and the global batch is split over ``dp_replicate x
dp_shard`` data-parallel rows. Consecutive ranks share a node under torchrun, so one block per
node (or a divisor of one) keeps FSDP2's all-gathers on the node; :mod:`.nodes` checks that the
sp and ep groups never cross a node. ``dp_replicate x dp_shard x sp`` is then the world.

* **FSDP2** shards every dense parameter over all ``dp_shard x sp`` ranks (the sequence
  shards of one row are data-parallel for the parameters: their gradients are summed too).
* **sp** (Ulysses): the attention of every layer all-to-alls from ``[S / sp, all heads]`` to
  ``[S, heads / sp]``, runs the plan's kernel, and all-to-alls back. ``sp`` must divide the
  number of query heads and of key/value heads.
* **ep** borrows ranks from the same grid: expert groups are consecutive blocks of ``ep``
  ranks in rank order (``sp`` innermost, then ``dp_shard``); each rank of a group owns
  ``E / ep`` experts. The expert parameters are then FSDP-sharded over the
  ``dp_shard x sp / ep`` ranks that own the same experts (the ranks with the same position
  in their block). ``ep`` must divide ``dp_shard x sp`` and the number of experts. With
  ``ep == sp`` the expert groups are the sequence-parallel groups; ``ep`` may also span
  several data-parallel rows (``dp_shard 2, sp 1, ep 2``) or a part of one SP group.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..config import ConfigError
from ..ops import PARALLEL

#: fields of the ``parallel:`` section, with what each means (for messages and the README)
FIELDS: Mapping[str, str] = {
    "dp_shard": "data-parallel ranks, FSDP2-sharded (with sp: the parameters are sharded over dp_shard x sp)",
    "dp_replicate": "HSDP replica groups: the parameters are replicated across them, sharded within each (default 1)",
    "sp": "Ulysses sequence-parallel degree: each rank holds 1/sp of every sequence",
    "ep": "expert-parallel degree: each rank owns 1/ep of the experts of every MoE layer",
    "ep_chunks": "split each rank's tokens into this many chunks so that the ep all-to-alls overlap the expert "
                 "compute (default 1: one exchange; > 1 needs ep > 1)",
    "timeout_s": "collective timeout in seconds: a rank that stops answering ends every rank after this",
    "reduce_dtype": "dtype FSDP2 sums gradients in across ranks: float32 (default) or bfloat16 (a bfloat16 job only)",
}

#: the values of ``parallel.reduce_dtype`` (the first is the default)
REDUCE_DTYPES = ("float32", "bfloat16")

#: the note a job with ``reduce_dtype: bfloat16`` prints and records
REDUCE_BF16_NOTE = ("gradients are summed across ranks in bfloat16 (half the reduce-scatter/all-reduce bytes); "
                    "the rounding differs from a float32 reduction, so losses differ from a float32-reduce run")

DEFAULT_TIMEOUT_S = 600.0


def world_from_env() -> int:
    """The number of processes of this job (torchrun's ``WORLD_SIZE``; 1 without it)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1") or 1)
    except ValueError:
        return 1


class ParallelConfigError(ConfigError):
    """The ``parallel:`` layout is malformed, or does not fit the world, the model or the batch."""


def _field_problem(name: str, value: Any) -> str | None:
    """What is wrong with ``value`` for the field ``name`` (None: nothing)."""
    if name == "reduce_dtype":
        if value not in REDUCE_DTYPES:
            return f"parallel.reduce_dtype must be one of {', '.join(REDUCE_DTYPES)}, got {value!r}"
    elif name == "timeout_s":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            return f"parallel.timeout_s must be a number of seconds > 0, got {value!r}"
    elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"parallel.{name} must be a whole number >= 1, got {value!r}"
    return None


def _ep_problem(dp_shard: int, sp: int, ep: int, ep_chunks: int = 1) -> str | None:
    if ep_chunks > 1 and ep <= 1:
        return (f"parallel.ep_chunks {ep_chunks} chunks the expert-parallel exchange, which ep {ep} does not have: "
                "set parallel.ep > 1 or drop ep_chunks")
    if (dp_shard * sp) % ep:
        return (f"parallel.ep {ep} must divide dp_shard x sp = {dp_shard} x {sp} = {dp_shard * sp}: "
                "expert groups are blocks of ep ranks taken from the dp_shard x sp ranks")
    return None


def read_fields(data: Any, where: str = "parallel") -> tuple[dict[str, Any], list[str]]:
    """The well-formed fields of a ``parallel:`` section, and every problem of the section (one
    message each: unknown fields, each malformed value, an ep that does not divide the ranks)."""
    if data is None:
        return {}, []
    if not isinstance(data, Mapping):
        return {}, [f"{where} must be a mapping such as {{dp_shard: 2, sp: 2, ep: 2}}, not {type(data).__name__}"]
    problems: list[str] = []
    unknown = [k for k in data if k not in FIELDS]
    if unknown:
        problems.append(f"{where}: unknown field(s) {', '.join(map(str, unknown))}; known: "
                        + "; ".join(f"{k} ({v})" for k, v in FIELDS.items()))
    fields: dict[str, Any] = {}
    for name in FIELDS:
        if name in data:
            problem = _field_problem(name, data[name])
            if problem:
                problems.append(problem)
            else:
                fields[name] = data[name]
    if all(name in fields or name not in data for name in ("dp_shard", "sp", "ep", "ep_chunks")):
        ep = _ep_problem(fields.get("dp_shard", 1), fields.get("sp", 1), fields.get("ep", 1), fields.get("ep_chunks", 1))
        if ep:
            problems.append(ep)
    return fields, problems


@dataclass(frozen=True)
class ParallelLayout:
    """How one job spreads over processes (see the module docstring for the rank layout)."""

    dp_shard: int = 1
    sp: int = 1
    ep: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    dp_replicate: int = 1
    reduce_dtype: str = REDUCE_DTYPES[0]
    ep_chunks: int = 1

    def __post_init__(self) -> None:
        problems = [p for name in FIELDS if (p := _field_problem(name, getattr(self, name)))]
        if not problems:
            object.__setattr__(self, "timeout_s", float(self.timeout_s))
            problems = [p for p in (_ep_problem(self.dp_shard, self.sp, self.ep, self.ep_chunks),) if p]
        if problems:
            raise ParallelConfigError("; ".join(problems), problems)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, *, where: str = "parallel") -> ParallelLayout:
        """The layout of a ``parallel:`` section; :class:`ParallelConfigError` lists every problem of it
        (its ``problems``, one message each)."""
        fields, problems = read_fields(data, where)
        if problems:
            raise ParallelConfigError("; ".join(problems), problems)
        return cls(**fields)

    @classmethod
    def data_parallel(cls, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> ParallelLayout:
        """The layout of a job with no ``parallel:`` section run on ``world_size`` processes: FSDP only."""
        return cls(dp_shard=world_size, timeout_s=timeout_s)

    # -- facts -----------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.sp

    @property
    def shard_size(self) -> int:
        """The ranks of one FSDP2 shard group (``dp_shard x sp``; all of them without ``dp_replicate``)."""
        return self.dp_shard * self.sp

    @property
    def dp_degree(self) -> int:
        """The data-parallel rows the global batch is split into: ``dp_replicate x dp_shard``."""
        return self.dp_replicate * self.dp_shard

    @property
    def is_trivial(self) -> bool:
        return self.world_size == 1

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's place: data-parallel row, sequence shard, expert group and rank in it."""
        return {"dp": rank // self.sp, "sp": rank % self.sp, "ep_group": rank // self.ep, "ep": rank % self.ep}

    def sp_group(self, rank: int) -> list[int]:
        start = rank - rank % self.sp
        return list(range(start, start + self.sp))

    def ep_group(self, rank: int) -> list[int]:
        start = rank - rank % self.ep
        return list(range(start, start + self.ep))

    def needs(self) -> dict[str, tuple[str, ...]]:
        """What kernels must declare (``KernelSpec.parallel``) to run in this layout, per op: each
        parallel mode an op offers (:data:`veomni_ops.ops.PARALLEL`: ``sp`` for attention, ``ep``
        for the experts) that this layout uses (its size above 1)."""
        active = {"sp": self.sp > 1, "ep": self.ep > 1}
        out = {op: tuple(m for m in modes if active.get(m)) for op, modes in PARALLEL.items()}
        return {op: modes for op, modes in out.items() if modes}

    # -- checks against the world, the model, the batch ----------------------------------------
    def check_world(self, world_size: int, launcher: str = "") -> None:
        if world_size != self.world_size:
            how = launcher or f"torchrun --nproc-per-node {self.world_size}"
            rep = f"dp_replicate {self.dp_replicate} x " if self.dp_replicate > 1 else ""
            raise ParallelConfigError(
                f"parallel: {rep}dp_shard {self.dp_shard} x sp {self.sp} = {self.world_size} process(es), but this job "
                f"runs in {world_size} (WORLD_SIZE={world_size}); make {rep}dp_shard x sp equal the number of "
                f"processes, or run it as {how} ..."
            )

    def check_model(self, config: Any) -> None:
        """Refuse, with the numbers, a layout the model's shapes do not allow (``config``: a transformers config)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        problems = []
        if self.sp > 1:
            for field in ("num_attention_heads", "num_key_value_heads"):
                n = getattr(text, field, None)
                if isinstance(n, int) and n % self.sp:
                    problems.append(f"parallel.sp {self.sp} must divide {field} = {n} (Ulysses gives each of the sp "
                                    f"ranks {field} / sp heads)")
            kinds = sorted({str(t) for t in (getattr(text, "layer_types", None) or [])}
                           - {"full_attention", "sliding_attention"})
            if kinds:
                problems.append(f"parallel.sp {self.sp}: the model has {', '.join(kinds)} layers, which mix tokens "
                                "along the sequence outside attention and have no sequence-parallel form here; use sp: 1")
        if self.ep > 1:
            experts = next((getattr(text, f) for f in ("num_experts", "num_local_experts", "n_routed_experts")
                            if isinstance(getattr(text, f, None), int)), None)
            if experts is None:
                problems.append(f"parallel.ep {self.ep}: the model has no routed experts (no num_experts in its "
                                "config); use ep: 1")
            elif experts % self.ep:
                problems.append(f"parallel.ep {self.ep} must divide the number of experts, {experts} (each of the ep "
                                "ranks of a group owns experts / ep of them)")
        if problems:
            raise ParallelConfigError("; ".join(problems))

    def check_batch(self, batch_size: int) -> None:
        if batch_size % self.dp_degree:
            what = (f"dp_replicate x dp_shard = {self.dp_replicate} x {self.dp_shard} = {self.dp_degree}"
                    if self.dp_replicate > 1 else f"parallel.dp_shard {self.dp_shard}")
            raise ParallelConfigError(
                f"train.batch_size {batch_size} is the global batch and {what} must divide it "
                f"(each data-parallel rank trains batch_size / {'(dp_replicate x dp_shard)' if self.dp_replicate > 1 else 'dp_shard'} rows)"
            )

    # -- printing ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The layout's fields and world size; ``reduce_dtype`` (and its note) only where it is not
        the default float32, so a default job's result JSON and checkpoint are as before."""
        out = {**asdict(self), "world_size": self.world_size}
        if self.reduce_dtype == REDUCE_DTYPES[0]:
            del out["reduce_dtype"]
        else:
            out["reduce_note"] = REDUCE_BF16_NOTE
        return out

    def describe(self) -> str:
        """Several lines: the layout, the groups and what is sharded how."""
        w = self.world_size
        rep = f"dp_replicate {self.dp_replicate} x " if self.dp_replicate > 1 else ""
        lines = [f"ParallelLayout: {w} process(es) = {rep}dp_shard {self.dp_shard} x sp {self.sp}; ep {self.ep}; "
                 f"collective timeout {self.timeout_s:g}s"]
        if self.dp_replicate > 1:
            lines.append(f"  HSDP: dense parameters sharded within each block of {self.shard_size} consecutive ranks "
                         f"(dp_shard x sp), replicated across the {self.dp_replicate} blocks, gradients summed")
        else:
            lines.append(f"  FSDP2: dense parameters sharded over all {w} ranks (dp_shard x sp), gradients summed")
        if self.reduce_dtype != REDUCE_DTYPES[0]:
            lines.append(f"  reduce_dtype: {self.reduce_dtype}: {REDUCE_BF16_NOTE}")
        if self.sp > 1:
            groups = " ".join(str(self.sp_group(r)) for r in range(0, w, self.sp))
            lines.append(f"  sp: Ulysses groups {groups}: each rank holds 1/{self.sp} of every sequence; attention "
                         "all-to-alls to full sequence x heads/sp around the plan's kernel")
        if self.ep > 1:
            groups = " ".join(str(self.ep_group(r)) for r in range(0, w, self.ep))
            lines.append(f"  ep: expert groups {groups}: each rank owns 1/{self.ep} of the experts; tokens dispatched "
                         f"by all-to-all; expert parameters FSDP-sharded over the {self.shard_size // self.ep} rank(s) "
                         "owning the same experts" + (" in each block, replicated across the blocks"
                                                      if self.dp_replicate > 1 else "")
                         + (f"; the all-to-alls in {self.ep_chunks} chunks, overlapping the experts"
                            if self.ep_chunks > 1 else ""))
        return "\n".join(lines)
