"""Adapters from the veomni-ops kernel contracts to Liger-Kernel's functions.

One module per op; each imports ``liger_kernel`` at module level, so import a module only
when its kernel is used (the specs name them with ``"module:attr"`` factories). This
``__init__`` imports nothing.
"""
