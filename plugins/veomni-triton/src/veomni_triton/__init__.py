"""veomni-triton: the veomni-ops project's own Triton kernels, as a backend plugin.

Importing this package is cheap: the kernels (and Triton) live in
:mod:`veomni_triton.kernels` and are imported only when a plan selects them. The
hook implementations the core discovers are in :mod:`veomni_triton.specs`.
"""

__version__ = "0.1.0"
