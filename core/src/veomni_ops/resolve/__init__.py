"""Resolution: ``(config, target) -> KernelPlan``. Strict, and it explains.

For each op: is the requested name registered, did its plugin load, does the device meet
the spec's hardware requirement, are its required distributions installed, does it have the
variant the model needs? Only then is its factory imported. Every refusal of one config is
collected and raised together as one :class:`ResolutionError`.

What it resolves for is a :class:`~veomni_ops.target.Target`: the device, the model's dtype,
its :class:`~veomni_ops.target.Mode` (training or inference, eager or compile), what the model
needs per op, the features its places need and what its parallel layout needs.
``resolve(config, device, needs=..., dtype=..., training=..., compile=...)`` is the same call
with the target's parts as arguments.

Names. A config names a kernel bare (``liger``) or qualified by the distribution that
registers it (``liger@veomni-liger``). A bare name that two installed distributions register
for the op is *contested*: it is refused, naming both, and the refusal lists the qualified
names to write. ``auto`` ranks every usable kernel by :data:`AUTO_ORDER`, and a plan entry's
reason says when a tie was broken and by which rule.

VeOmni's values. A VeOmni value whose kernel depends on the device (``moe_implementation:
fused``; VeOmni's GPU defaults on an Ascend NPU) is resolved as the kernel it is on the device
planned for (:meth:`~veomni_ops.config.OpsConfig.for_device`), and the plan entry says so. A
VeOmni kernel veomni-ops does not provide (``magi_attention``, ...) is refused, where no installed
plugin provides the name, with what it is in VeOmni, what it needs and what to write instead
(:mod:`veomni_ops.veomni`).

The package, by concern:

- :mod:`.load`: importing a kernel's factory once per process, remembering failures
  (:func:`load_kernel`, :func:`import_failure`);
- :mod:`.checks`: whether a kernel can serve a target (:func:`static_problem`,
  :func:`kernel_problem`, :class:`OpRequest`);
- :mod:`.refusal`: the types a refusal is made of (:class:`RefusalKind`, :class:`Problem`,
  :class:`Refusal`, :class:`ResolutionError`), which :mod:`.checks` and :mod:`.explain` share;
- :mod:`.explain`: refusals and their fix-it hints (:func:`install_hint`; it re-exports the
  refusal types);
- :mod:`.rank`: what ``auto`` takes (:data:`AUTO_ORDER`, the compile-mode choices, a plan lock);
- :mod:`.entry`: :func:`resolve`.
"""

from __future__ import annotations

from ..target import MemoryBudget, Mode, Need, Needs, Target
from .checks import OpRequest, kernel_problem, requirement_problem, spec_problem, static_problem, unmet_requirements
from .entry import all_needs, resolve, resolve_named
from .explain import PICK_ANOTHER, checkout_plugin_dir, install_hint
from .load import import_failure, load_kernel
from .rank import AUTO_ORDER, REFERENCE, REFERENCE_PREFERS, resolve_auto, resolve_by_lock, variants_for
from .refusal import Problem, Refusal, RefusalKind, ResolutionError

#: The name ``veomni_ops.train.job`` imports (kept while it does): :func:`all_needs`.
_all_needs = all_needs

__all__ = [
    "AUTO_ORDER",
    "PICK_ANOTHER",
    "REFERENCE",
    "REFERENCE_PREFERS",
    "MemoryBudget",
    "Mode",
    "Need",
    "Needs",
    "OpRequest",
    "Problem",
    "Refusal",
    "RefusalKind",
    "ResolutionError",
    "Target",
    "all_needs",
    "checkout_plugin_dir",
    "import_failure",
    "install_hint",
    "kernel_problem",
    "load_kernel",
    "requirement_problem",
    "resolve",
    "resolve_auto",
    "resolve_by_lock",
    "resolve_named",
    "spec_problem",
    "static_problem",
    "unmet_requirements",
    "variants_for",
]
