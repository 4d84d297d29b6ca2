"""The heavy half of veomni-triton: Triton kernels wrapped as ``torch.library`` custom ops.

Import the op modules directly (``veomni_triton.kernels.rms_norm`` ...); this package
imports nothing so that loading one kernel does not compile or import the others.
"""
