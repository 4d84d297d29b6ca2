"""``rms_norm``'s reference kernels live in the op's folder, :mod:`veomni_ops.ops.rms_norm.kernel`;
this module keeps the import path plugins use (``from veomni_ops.kernels.rms_norm import ...``)."""

from ..ops.rms_norm.kernel import *  # noqa: F403
from ..ops.rms_norm.kernel import __all__ as __all__
