"""STAND-IN for quack-kernels 0.6.5, for the veomni-quack unit tests only (plain torch, CPU).

Same module and function names and signatures as the real package for what the adapters
call; the numerics follow the real kernels' documented semantics (float32 math, the same
roundings) and every function asserts the layout assumptions the real compiled kernels
make, so an adapter that passes a misaligned view fails here as it would there. Not the
real Quack: nothing here runs on a GPU.
"""

IS_STAND_IN = True
__version__ = "0.6.5"

from quack.cross_entropy import cross_entropy  # noqa: E402
from quack.rmsnorm import rmsnorm  # noqa: E402

__all__ = ["rmsnorm", "cross_entropy"]
