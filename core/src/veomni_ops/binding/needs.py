"""What a model asks of resolution: its places (:func:`survey`), per op the variants and features
they need (:func:`needs_of`, :func:`features_of`), and which of them binding may fill under a config
(:func:`usable_places`: a named kernel where none can go is refused here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from torch import nn

from ..config import AUTO, OP_TO_FIELD, OpsConfig, as_config
from ..spec import split_name
from .binders import NotBindable, Place, find_places
from .errors import BindingError, version_hint


def survey(model: nn.Module) -> list[Place]:
    """Every place in ``model`` where an op's kernel can be bound, with the variant it needs."""
    try:
        return find_places(model)
    except NotBindable as e:
        raise BindingError(f"{type(model).__name__}: {e} ({version_hint()})") from None


def needs_of(places: list[Place]) -> dict[str, list]:
    """What resolution must provide for these places: per op, the variants needed."""
    needs: dict[str, list] = {}
    for p in places:
        lst = needs.setdefault(p.op, [])
        if p.variant not in lst:
            lst.append(p.variant)
    return needs


def features_of(places: list[Place]) -> dict[str, frozenset[str]]:
    """Per op, every feature some place of that op needs (one kernel serves them all)."""
    out: dict[str, frozenset[str]] = {}
    for p in places:
        if p.features:
            out[p.op] = out.get(p.op, frozenset()) | p.features
    return out


def model_needs(model: nn.Module, config: OpsConfig | Mapping[str, Any] | str | None = None
                ) -> tuple[dict[str, list], dict[str, frozenset[str]]]:
    """What binding ``config`` into ``model`` asks resolution for: per op the variants its places
    need (:func:`needs_of`) and the features they need (:func:`features_of`), over the places
    binding would fill (not those it leaves to the model's or your code)."""
    cfg = as_config(config)
    places, _ = usable_places(type(model).__name__, cfg, survey(model))
    return needs_of(places), features_of(places)


def _named(cfg: OpsConfig, op: str) -> bool:
    """Did the config name a kernel for ``op`` (not ``auto``)?"""
    return cfg.for_op(op) != AUTO


def _kernel(cfg: OpsConfig, op: str) -> str:
    """The kernel the config names for ``op``, without a distribution qualifier
    (``eager@veomni-ops`` is ``eager``)."""
    return split_name(cfg.for_op(op))[0]


def usable_places(owner: str, cfg: OpsConfig, places: list[Place]) -> tuple[list[Place], list[tuple[str, str, str]]]:
    """The places binding may fill, and those it leaves (path, op, why). A named kernel for a
    place that must be left, or for an op the model has no place for, is refused."""
    # Places no kernel can go (e.g. an adapter on lm_head): reported; a named kernel for one is refused.
    left = [p for p in places if p.left]
    refused_left = [p for p in left if _named(cfg, p.op) and _kernel(cfg, p.op) != "eager"]
    if refused_left:
        raise BindingError(f"{owner}: no kernel can be bound where the config names one:\n"
                           + "\n".join(f"  - {OP_TO_FIELD[p.op]}={cfg.for_op(p.op)!r} at {p.path or '<model>'}: "
                                       f"{p.left}" for p in refused_left)
                           + "\nSet those fields to 'auto' or 'eager' (the model's own code then runs there).")
    skipped = [(p.path, p.op, cast(str, p.left)) for p in left]
    places = [p for p in places if not p.left]

    # User code: a named non-eager kernel for an overridden method is refused; otherwise the
    # place is left to the user's code (eager *is* what that code computes around).
    foreign = [p for p in places if p.foreign]
    refused = [p for p in foreign if _named(cfg, p.op) and _kernel(cfg, p.op) != "eager"]
    if refused:
        lines = [f"  - {OP_TO_FIELD[p.op]}={cfg.for_op(p.op)!r}: {p.foreign} is user code "
                 f"(module {p.path or '<model>'}); binding would replace it" for p in refused]
        raise BindingError(
            f"{owner}: veomni-ops will not replace methods your code overrides:\n" + "\n".join(lines)
            + "\nSet those fields to 'auto' or 'eager' to keep your code (the op then runs as your method does), "
            "or move your change out of the overriding method (e.g. add loss terms outside model.forward)."
        )
    skipped += [(p.path, p.op, f"user code: {p.foreign}") for p in foreign]
    places = [p for p in places if not p.foreign]

    have_ops = {p.op for p in places}
    unplaced = [
        f"{OP_TO_FIELD[op]}={cfg.for_op(op)!r}"
        for op in OP_TO_FIELD
        if _kernel(cfg, op) not in (AUTO, "eager") and op not in have_ops
    ]
    if unplaced:
        raise BindingError(
            f"{owner} has no place for: {', '.join(unplaced)}. The model has no module for that op "
            f"(or not in a form veomni-ops can bind; {version_hint()}); set the field to 'auto' or 'eager'."
        )
    return places, skipped

