"""Bind a :class:`KernelPlan` into one transformers model instance.

Everything is per instance: a module's ``forward`` is replaced by an instance attribute
that calls the plan's kernel directly (no lookup per call), and the attention modules run
copies of their forward whose globals name the plan's kernels (``apply_rotary_pos_emb``,
the attention table): one copy per binding and set of kernels, shared by the layers, with a
code object of its own (``binding.functions.copy_with_globals`` says why torch.compile needs
both); decorated forwards are copied through their decorators. Nothing module-level is
mutated, so two models in one process can carry different plans, and
``torch.compile(fullgraph=True)`` traces straight through.

Where each op lives is one :class:`~veomni_ops.binding.binders.Binder` per op
(:data:`~veomni_ops.binding.binders.BINDERS`). What each place needs is read from the
model: the RMSNorm variant by probing the module, the rotary variant from the rotary
dimension, the attention features (softcap, sinks, sliding window, dropout) from each
attention module. ``auto`` only takes a kernel that honours them; a named kernel that
cannot is refused here, not at the first forward.

User code is never replaced: a method a user's subclass overrides is not bound (a named
kernel for it is refused, naming the class and the method). The transformers version is
checked against the range this release supports (:mod:`.versions`).

The package's modules: :mod:`.entry` (``apply``), :mod:`.needs` (what the model's places need),
:mod:`.planning` (the plan for them), :mod:`.install` (putting its kernels in), :mod:`.record`
(the :class:`Binding`), :mod:`.errors`; the places themselves are the op folders' binders
(:mod:`.binders`, :mod:`.place`), and the forwards are built by :mod:`.functions` and :mod:`.head`.
"""

from __future__ import annotations

from .binders import Place
from .entry import ParallelWrapper, apply
from .errors import BindingError
from .needs import features_of as features_of
from .needs import model_needs as model_needs
from .needs import needs_of, survey
from .record import Binding, DroppedBinding

# A model pickled while bound names ``_dropped_binding`` and ``DroppedBinding`` here (see :mod:`.record`).
from .record import _dropped_binding as _dropped_binding

__all__ = ["Binding", "BindingError", "DroppedBinding", "ParallelWrapper", "Place", "apply", "needs_of", "survey"]
