"""``load_balancing_loss``'s reference kernels live in the op's folder, :mod:`veomni_ops.ops.load_balancing_loss.kernel`;
this module keeps the import path plugins use (``from veomni_ops.kernels.load_balancing import ...``).

Resolved on first use (:mod:`._reexport`), so that importing this module imports no kernel.
"""

from ._reexport import lazy

__getattr__, __dir__ = lazy(__name__, "veomni_ops.ops.load_balancing_loss.kernel")
