"""What a binding is once made: :class:`Binding` (what ``apply`` did, and how to undo it),
:class:`Undo` (what ``remove`` puts back) and :class:`DroppedBinding` (what a model pickled while
bound carries instead)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..plan import KernelPlan, text_columns

#: What binding changed on one module's ``forward``: the module, whether it had an instance
#: ``forward`` before (someone else's) and that value.
ForwardUndo = tuple[nn.Module, bool, Any]


@dataclass
class Undo:
    """What ``Binding.remove`` puts back, and the state of the binding."""

    root: nn.Module
    forwards: list[ForwardUndo] = field(default_factory=list)
    #: (module, the config object it had before binding gave it a private copy)
    configs: list[tuple[nn.Module, Any]] = field(default_factory=list)
    #: (the private copy, the attention implementation the original named), for unpickling
    attn_names: list[tuple[Any, Any]] = field(default_factory=list)
    in_force: bool = True
    #: what remove() took out (in the order of ``configs`` and ``forwards``), for restore()
    copies: list[Any] = field(default_factory=list)
    bound_forwards: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Binding:
    """What ``apply`` did: the plan, per module path the op, variant and kernel bound, and
    the places left to the model's own code (path, op, why).

    ``remove()`` puts the model back exactly as it was. ``copy.deepcopy`` of the model keeps
    the binding in force on the copy; pickling (``torch.save`` of the whole model) does not
    carry it: the unpickled model runs transformers' own code and its ``veomni_ops_binding``
    is a :class:`DroppedBinding` saying so.
    """

    plan: KernelPlan
    bound: tuple[tuple[str, str, str, str], ...]
    skipped: tuple[tuple[str, str, str], ...] = ()
    #: other facts the printout gives (the logits path's loss kernel, a copied config)
    notes: tuple[str, ...] = ()
    _undo: Undo | None = field(default=None, repr=False, compare=False)

    @property
    def in_force(self) -> bool:
        """Is the model still bound (not ``remove()`` d)?"""
        return self._undo is not None and self._undo.in_force

    def remove(self) -> None:
        """Restore the model as it was before ``apply``: its forwards, its config objects, no
        ``veomni_ops_binding``. Outputs are then bitwise those of the unbound model. A second
        call does nothing."""
        u = self._undo
        if u is None or not u.in_force:
            return
        u.copies = [m.__dict__["config"] for m, _ in u.configs]
        u.bound_forwards = [m.__dict__["forward"] for m, _, _ in u.forwards]
        for m, cfg in u.configs:
            m.__dict__["config"] = cfg
        for m, had, previous in reversed(u.forwards):
            if had:
                m.__dict__["forward"] = previous
            else:
                m.__dict__.pop("forward", None)
        if u.root.__dict__.get("veomni_ops_binding") is self:
            del u.root.__dict__["veomni_ops_binding"]
        u.in_force = False

    def restore(self) -> None:
        """Bind again what ``remove()`` unbound (the same forwards and config copies)."""
        u = self._undo
        if u is None or u.in_force:
            return
        for (m, _), cfg in zip(u.configs, u.copies):
            m.__dict__["config"] = cfg
        for (m, _, _), fn in zip(u.forwards, u.bound_forwards):
            m.__dict__["forward"] = fn
        u.root.__dict__["veomni_ops_binding"] = self
        u.in_force = True

    def summary(self) -> dict[str, int]:
        """Per op, how many places were bound: ``{"rms_norm": 5, "attention": 1, ...}``."""
        out: dict[str, int] = {}
        for _, op, _, _ in self.bound:
            out[op] = out.get(op, 0) + 1
        return out

    def table(self) -> str:
        """What ``print(binding)`` shows: one row per bound place (path, op, variant, kernel
        and where it comes from), then the places left to the model's own code, with why."""
        state = "" if self.in_force else " (removed: the model runs its own code again)"
        head = (f"Binding for {self.plan.device.describe()}, mode {self.plan.mode.execution}{state}: "
                f"{len(self.bound)} place(s) bound"
                + (f", {len(self.skipped)} left to the model's own code" if self.skipped else ""))
        rows = [("path", "op", "variant", "kernel")]
        for path, op, variant, kernel in self.bound:
            e = self.plan.get(op, variant)
            rows.append((path or "<model>", op, variant, kernel + (f" ({e.distribution})" if e is not None else "")))
        lines = [head, *text_columns(rows, indent="  ")]
        if self.skipped:
            lines.append("left to the model's own code:")
            lines += text_columns([("path", "op", "why")] + [(p or "<model>", op, why) for p, op, why in self.skipped],
                                 indent="  ")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def __deepcopy__(self, memo: dict[int, Any]) -> Binding:
        # The copied model's forwards are rebound to its own modules (Python copies bound
        # methods that way): the copy is bound too, and its binding undoes the copy.
        undo = copy.deepcopy(self._undo, memo)
        return Binding(self.plan, self.bound, self.skipped, self.notes, undo)

    def __copy__(self) -> Binding:
        return self

    def __reduce__(self):
        # Kernels are not carried by pickle: the bound forwards pickle as "the module's
        # forward", which is transformers' own on unpickling. Say so, and give the config
        # copies their original attention implementation back.
        names = [] if self._undo is None or not self._undo.in_force else self._undo.attn_names
        return (_dropped_binding, (self.bound, self.skipped, names))


@dataclass(frozen=True)
class DroppedBinding:
    """The ``veomni_ops_binding`` of a model that was pickled while bound (``torch.save`` of the
    whole model): nothing is bound; ``bound`` says what was."""

    bound: tuple[tuple[str, str, str, str], ...]
    skipped: tuple[tuple[str, str, str], ...] = ()
    in_force: bool = False

    def summary(self) -> dict[str, int]:
        return {}

    def remove(self) -> None:
        """Nothing to remove."""

    def table(self) -> str:
        return (f"veomni-ops binding not in force: the model was pickled while bound ({len(self.bound)} place(s)), "
                "and pickling does not carry kernels, so it runs transformers' own code. Call "
                "veomni_ops.apply(model, config) again to bind it (or save model.state_dict() and bind after loading).")

    def __str__(self) -> str:
        return self.table()


def _dropped_binding(bound, skipped, attn_names) -> DroppedBinding:
    for cfg, name in attn_names:
        cfg._attn_implementation = name
    return DroppedBinding(tuple(bound), tuple(skipped))


# Pickles name these by the package (``veomni_ops.binding``), where they were defined until the
# package was split, and where it still offers them: a model saved while bound loads the same way
# with this release and the ones before it.
DroppedBinding.__module__ = _dropped_binding.__module__ = "veomni_ops.binding"
