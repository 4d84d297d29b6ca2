"""``load_balancing_loss``'s reference kernels live in the op's folder, :mod:`veomni_ops.ops.load_balancing_loss.kernel`;
this module keeps the import path plugins use (``from veomni_ops.kernels.load_balancing import ...``)."""

from ..ops.load_balancing_loss.kernel import *  # noqa: F403
from ..ops.load_balancing_loss.kernel import __all__ as __all__
