"""Conformance of the backend's swiglu kernel against the core's float64 eager reference.

The base class generates one test per dtype the spec declares and per swiglu case of the
kit (odd sizes, strided views, saturating inputs), forward and backward. It finds the
kernel the way users do: through the installed entry point.

The same checks without writing a class: ``pytest --veomni-ops-backend template``.
"""

from veomni_ops.testing import SwigluConformance


class TestTemplateSwiglu(SwigluConformance):
    kernel_name = "template"
