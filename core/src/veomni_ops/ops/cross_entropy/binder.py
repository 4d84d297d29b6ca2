"""Where ``cross_entropy`` lives in a model: the causal-LM head (a module holding ``lm_head`` and
``model``), bound as a whole by :mod:`veomni_ops.binding.head`."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ...binding.place import Binder, Edits, Place, Survey, head_parts, head_problem


def _find_head(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    if not head_parts(m):
        return []
    return [Place("cross_entropy", ("fused_linear", "logits"), path, m, left=head_problem(m))]


def _bind_cross_entropy(place: Place, kernel: Callable, edits: Edits) -> None:
    edits.head.setdefault(id(place.module), {"module": place.module})["ce"] = (place.info["chosen_variant"], kernel)


BINDER = Binder("cross_entropy", _find_head, _bind_cross_entropy, head=True)
