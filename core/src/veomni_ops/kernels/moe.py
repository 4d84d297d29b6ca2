"""``moe_experts``'s reference kernels live in the op's folder, :mod:`veomni_ops.ops.moe_experts.kernel`;
this module keeps the import path plugins use (``from veomni_ops.kernels.moe import ...``)."""

from ..ops.moe_experts.kernel import *  # noqa: F403
from ..ops.moe_experts.kernel import __all__ as __all__
