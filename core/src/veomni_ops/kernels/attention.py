"""``attention``'s reference kernels live in the op's folder, :mod:`veomni_ops.ops.attention.kernel`;
this module keeps the import path plugins use (``from veomni_ops.kernels.attention import ...``)."""

from ..ops.attention.kernel import *  # noqa: F403
from ..ops.attention.kernel import __all__ as __all__
