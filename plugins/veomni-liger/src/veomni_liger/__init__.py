"""veomni-liger: Liger-Kernel as a veomni-ops backend.

Light on purpose: importing this package (or :mod:`veomni_liger.specs`, the entry point
the core discovers) imports neither ``liger_kernel`` nor Triton. The adapters live in
:mod:`veomni_liger.kernels` and are imported only when a plan selects them.
"""

__version__ = "0.1.0"
