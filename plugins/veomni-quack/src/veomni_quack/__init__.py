"""veomni-quack: Quack (quack-kernels, CuTe-DSL) as a backend of veomni-ops.

The entry point is :mod:`veomni_quack.specs` (light: imports neither quack nor cutlass);
the adapters live in :mod:`veomni_quack.kernels` and are imported only when selected.
"""

__version__ = "0.1.0"
