"""``cross_entropy``'s reference kernels live in the op's folder, :mod:`veomni_ops.ops.cross_entropy.kernel`;
this module keeps the import path plugins use (``from veomni_ops.kernels.cross_entropy import ...``)."""

from ..ops.cross_entropy.kernel import *  # noqa: F403
from ..ops.cross_entropy.kernel import __all__ as __all__
