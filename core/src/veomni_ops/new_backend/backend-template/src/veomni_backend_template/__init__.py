"""veomni-backend-template: a minimal third-party backend for veomni-ops.

Nothing is imported here: veomni-ops loads :mod:`veomni_backend_template.specs` (light)
through the entry point, and imports :mod:`veomni_backend_template.kernels.swiglu` (heavy)
only when a config selects the ``template`` kernel.
"""

__version__ = "0.1.0"
