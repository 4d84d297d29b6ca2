"""Adapters from the veomni-ops kernel contracts to torch_npu's Ascend kernels.

One module per op; each imports ``torch_npu`` at module level (through :mod:`._common`, which
turns a missing or broken torch_npu into an ImportError saying how to install it), so import
a module only when its kernel is used (the specs name them with ``"module:attr"``
factories). This ``__init__`` imports nothing.
"""
