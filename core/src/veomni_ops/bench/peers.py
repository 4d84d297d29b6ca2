"""Benchmark peers: other projects' kernels measured beside ours, as their users call them.

A peer is not a registered kernel (nothing resolves to it, and no kernel of ours depends on it):
it is a row in ``veomni-ops bench`` where its distribution is installed, so a table compares
our kernels with what a user would otherwise pick, in the same run, on the same inputs. Each
peer is adapted to the op's kernel contract (``hookspecs``) and nothing more: its own defaults
stay, and where it cannot take an input (a bias, say) the row is an error that says so.

A peer is called the way its own users call it, even where that differs from how our adapter of
the same project calls it (Liger's RoPE rotates the model's q/k in place; veomni-liger copies
them first): its ``about`` text says which number the row shows, and the result carries it
(``peers`` in the JSON, a "Peers" list under the table).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any


@dataclass(frozen=True)
class Peer:
    name: str  #: the row's kernel column
    distribution: str  #: the PyPI distribution that must be installed
    op: str
    variant: str
    load: Callable[[], Callable[..., Any]]  #: imports the peer; returns a callable in the op's contract
    about: str
    device_types: tuple[str, ...] = ("cuda",)

    def version(self) -> str | None:
        try:
            return metadata.version(self.distribution)
        except metadata.PackageNotFoundError:
            return None


def _cut_cross_entropy() -> Callable[..., Any]:
    from cut_cross_entropy import linear_cross_entropy

    def call(hidden: Any, weight: Any, labels: Any, *, bias: Any = None, ignore_index: int = -100) -> Any:
        if bias is not None:
            raise ValueError("Cut Cross-Entropy takes no lm_head bias")
        return linear_cross_entropy(hidden, weight, labels, ignore_index=ignore_index, reduction="sum")

    return call


def _liger_direct() -> Callable[..., Any]:
    from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss

    losses: dict[int, Any] = {}

    def call(hidden: Any, weight: Any, labels: Any, *, bias: Any = None, ignore_index: int = -100) -> Any:
        loss = losses.get(ignore_index)
        if loss is None:
            loss = losses[ignore_index] = LigerFusedLinearCrossEntropyLoss(ignore_index=ignore_index,
                                                                           reduction="sum")
        return loss(weight, hidden, labels, bias)

    return call


def _liger_rotary_full() -> Callable[..., Any]:
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    # transformers calls apply_rotary_pos_emb(q, k, cos, sin): the op's own signature
    return liger_rotary_pos_emb


def _liger_rotary_partial() -> Callable[..., Any]:
    import inspect

    from liger_kernel.ops.rope import rope_forward
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    if "rotary_dim" not in inspect.signature(rope_forward).parameters:
        # before 0.8.5 Liger read cos/sin as if they were head-dim wide: a wrong result, timed
        raise ImportError("this liger-kernel rotates the whole head only (partial rotary needs >= 0.8.5)")
    return liger_rotary_pos_emb


_LIGER_ROTARY = (
    "liger_rotary_pos_emb(q, k, cos, sin) as transformers calls it once {patch} has replaced "
    "apply_rotary_pos_emb: q/k are the attention's [B, S, H, D] projections viewed as [B, H, S, D], which "
    "Liger rotates in place (no copy), and its backward rotates the incoming gradient in place. The `liger` "
    "row (veomni-liger, the registered kernel) runs the same Triton kernel on private copies of q and k "
    "(forward) and of dq and dk (backward), so that the op leaves its inputs untouched: its wall and kernel ms "
    "include those copies, this row's do not (kernel ms: the device time of every kernel and copy a call "
    "launches). This row rotates the bench's inputs in place, call after call, as the model rotates each "
    "layer's fresh projection."
)

PEERS: tuple[Peer, ...] = (
    Peer("cut-cross-entropy", "cut-cross-entropy", "cross_entropy", "fused_linear", _cut_cross_entropy,
         "Apple's Cut Cross-Entropy, linear_cross_entropy(reduction='sum') with its default gradient filter"),
    Peer("liger-kernel (direct)", "liger-kernel", "cross_entropy", "fused_linear", _liger_direct,
         "LigerFusedLinearCrossEntropyLoss(reduction='sum') with Liger's own chunking, not veomni-liger's"),
    Peer("liger", "liger-kernel", "rotary", "full", _liger_rotary_full,
         _LIGER_ROTARY.format(patch="apply_liger_kernel_to_qwen3")),
    Peer("liger", "liger-kernel", "rotary", "partial", _liger_rotary_partial,
         _LIGER_ROTARY.format(patch="apply_liger_kernel_to_qwen3_next(rope=True)")),
)


def peers_for(op: str, variant: str) -> list[Peer]:
    """The peers of ``op``/``variant`` whose distribution is installed here."""
    return [p for p in PEERS if p.op == op and p.variant == variant and p.version() is not None]
