"""``rotary``'s reference kernels live in the op's folder, :mod:`veomni_ops.ops.rotary.kernel`;
this module keeps the import path plugins use (``from veomni_ops.kernels.rotary import ...``)."""

from ..ops.rotary.kernel import *  # noqa: F403
from ..ops.rotary.kernel import __all__ as __all__
