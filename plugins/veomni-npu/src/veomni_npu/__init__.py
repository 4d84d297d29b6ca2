"""veomni-npu: Ascend NPU kernels (through torch_npu) as a veomni-ops backend.

Light on purpose: importing this package (or :mod:`veomni_npu.specs`, the entry point the
core discovers) does not import ``torch_npu``. The adapters live in :mod:`veomni_npu.kernels`
and are imported only when a plan selects them.

Nothing in this distribution has run on a real Ascend NPU: its tests run the adapters
against a stand-in ``torch_npu`` written in plain torch from Ascend's documentation.
"""

__version__ = "0.1.0"
