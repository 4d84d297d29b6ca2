"""Backends shipped inside the core distribution.

:mod:`veomni_ops.backends.reference` registers the core's own kernels (``eager`` for every
op and variant, plus the portable ``sdpa``, ``chunked`` and ``grouped_mm``) through the
same ``veomni_ops.backends`` entry-point group and hooks as any plugin.
"""
