"""``swiglu``'s reference kernels live in the op's folder, :mod:`veomni_ops.ops.swiglu.kernel`;
this module keeps the import path plugins use (``from veomni_ops.kernels.swiglu import ...``)."""

from ..ops.swiglu.kernel import *  # noqa: F403
from ..ops.swiglu.kernel import __all__ as __all__
