"""The set-up every backend's tests share, from veomni-ops (:mod:`veomni_ops.testing.backend_tests`).

Here only ``seeded``: each test starts from ``torch.manual_seed(0)``. A backend whose vendor
library cannot run on the test machine keeps plain-PyTorch stand-ins of it in
``tests/standins/`` and puts them first on ``sys.path`` from this file, before any kernel module
is imported::

    use_standins(Path(__file__).parent / "standins", "my_vendor", fix="on a GPU, run veomni-ops check")

A Triton backend calls ``triton_interpreter_unless_cuda()`` here instead, so that its kernels
run on the CPU interpreter where no GPU is.
"""

from veomni_ops.testing.backend_tests import seeded  # noqa: F401  (an autouse fixture)
