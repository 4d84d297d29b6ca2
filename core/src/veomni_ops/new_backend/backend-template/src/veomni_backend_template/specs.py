"""The backend's spec module: what veomni-ops discovers through the entry point.

It must stay LIGHT: it imports ``veomni_ops`` only — no torch, no Triton, no vendor library,
no model code — because every process that uses veomni-ops imports it during discovery,
whether or not a config ever selects this backend. The kernel is named by its ``factory``
string and imported only when resolution accepts it.
"""

from __future__ import annotations

from veomni_ops.hookspecs import hookimpl
from veomni_ops.spec import HardwareRequirement, KernelSpec, SpecDefaults, Tolerance

# The veomni-ops plugin API versions this backend was built for: every release of the core
# whose plugin API (veomni_ops.PLUGIN_API_VERSION) is 1.x. Outside this range discovery refuses
# the backend with a load failure that says whether to upgrade veomni-ops or this backend;
# without it, the backend loads with a warning. Raise the upper bound only after testing
# against the new major version.
VEOMNI_OPS_PLUGIN_API = ">=1.0,<2"

# What every kernel of this backend shares (a backend with one kernel or twenty writes this
# once; each hook below then declares its kernels with `_TEMPLATE.spec(...)`).
_TEMPLATE = SpecDefaults(
    # What users write: `swiglu_mlp_implementation: template`.
    name="template",
    # The package the factories live in: "swiglu:silu_mul" is
    # "veomni_backend_template.kernels.swiglu:silu_mul", and the attribute IS the kernel.
    kernels="veomni_backend_template.kernels",
    # Plain PyTorch runs everywhere. A CUDA-only kernel would say
    # HardwareRequirement(("cuda",), min_capability=(8, 0)).
    hardware=HardwareRequirement(("any",)),
    # Distributions checked from installed metadata BEFORE the factory is imported; a
    # vendor-library backend lists its library here, e.g. ("liger-kernel>=0.6",).
    requires=("torch>=2.4",),
    supports_backward=True,
    # torch.autograd.Function traces under torch.compile(fullgraph=True) (tested).
    supports_compile=True,
    dtypes=("float32", "bfloat16", "float16", "float64"),
    # `auto` takes the highest priority usable here: the core's eager is 0, its portable
    # kernels 10, vendor backends 20-40. At 0, a tie with the core's eager goes to the core:
    # installing this backend changes no one's `auto`; users select it by name. Raise it only
    # once `veomni-ops check` and `veomni-ops bench` show this kernel right on every dtype
    # above and faster than what it would displace, for every model of every user who installs it.
    priority=0,
    install_hint="pip install veomni-backend-template",
)


@hookimpl
def swiglu() -> list[KernelSpec]:
    return [
        _TEMPLATE.spec(
            "swiglu", "standard", "swiglu:silu_mul",
            "template: silu(gate) * up with a hand-written fused backward (plain PyTorch)",
            # Against the float64 reference, for the output and both gradients. The math is
            # float32 (float64 for float64) with one rounding to the input dtype at the end
            # (veomni_ops.spec has presets for the common cases: ELEMENTWISE, MATMUL).
            tolerances={
                "float64": Tolerance(1e-12, 1e-10),
                "float32": Tolerance(1e-5, 1e-5),
                "bfloat16": Tolerance(1.6e-2, 1.6e-2),
                "float16": Tolerance(2e-3, 2e-3),
            },
        )
    ]
