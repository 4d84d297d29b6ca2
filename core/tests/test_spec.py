import pytest
from veomni_ops import HardwareRequirement, KernelSpec, SpecError, Tolerance
from veomni_ops.spec import DEFAULT_TOLERANCES, normalize_name


def spec(**kw):
    base = dict(name="x", op="rms_norm", variant="standard", factory="m:f")
    base.update(kw)
    return KernelSpec(**base)


def test_name_is_normalised():
    assert spec(name="  Flash-Attention.4 ").name == "flash_attention_4"
    assert normalize_name("Liger") == "liger"


@pytest.mark.parametrize("bad", ["", "9lives", "a/b", "näme"])
def test_bad_names_refused(bad):
    with pytest.raises(SpecError, match="is not valid"):
        spec(name=bad)


def test_unknown_op_and_variant():
    with pytest.raises(SpecError, match="unknown op 'rmsnorm'; known ops: rms_norm"):
        spec(op="rmsnorm")
    with pytest.raises(SpecError, match="op 'rms_norm' has no variant 'gemma'; its variants are: standard, offset"):
        spec(variant="gemma")


def test_factory_forms():
    assert spec(factory="pkg.mod:attr").factory_repr() == "pkg.mod:attr"
    assert spec(factory=lambda: print).factory_repr().startswith("test_spec:")
    with pytest.raises(SpecError, match="must be 'package.module:attr'"):
        spec(factory="pkg.mod.attr")
    with pytest.raises(SpecError, match="factory must be"):
        spec(factory=42)


def test_hardware_validation():
    hw = HardwareRequirement("CUDA", min_capability="9.0", max_capability="sm_100")
    assert hw.device_types == ("cuda",) and hw.min_capability == (9, 0) and hw.max_capability == (10, 0)
    assert hw.describe() == "cuda sm 9.0..10.0"
    with pytest.raises(SpecError, match="unknown device type 'gpu'"):
        HardwareRequirement(("gpu",))
    with pytest.raises(SpecError, match="above max_capability"):
        HardwareRequirement(("cuda",), min_capability=(9, 0), max_capability=(8, 0))
    with pytest.raises(SpecError, match="not a compute capability"):
        HardwareRequirement(("cuda",), min_capability="hopper")


def test_requires_and_dtypes_validated():
    assert spec(requires="liger-kernel>=0.6").requires == ("liger-kernel>=0.6",)
    with pytest.raises(SpecError, match="not a valid requirement"):
        spec(requires=("liger kernel >>= 1",))
    with pytest.raises(SpecError, match="unknown dtype 'bf16'"):
        spec(dtypes=("bf16",))


def test_tolerances_per_dtype():
    s = spec(tolerances={"bfloat16": Tolerance(1e-2, 1e-2), "float32": (1e-6, 1e-5)})
    assert s.tolerance("bfloat16") == Tolerance(1e-2, 1e-2)
    assert s.tolerance("torch.float32") == Tolerance(1e-6, 1e-5)
    assert s.tolerance("float16") == DEFAULT_TOLERANCES["float16"]
    with pytest.raises(SpecError, match="tolerance for unknown dtype"):
        spec(tolerances={"fp8": (1, 1)})
    with pytest.raises(SpecError, match="non-negative"):
        Tolerance(-1, 0)


def test_spec_is_frozen_and_serialisable():
    s = spec()
    with pytest.raises(AttributeError):
        s.name = "y"
    d = s.to_dict()
    assert d["op"] == "rms_norm" and d["hardware"]["device_types"] == ["any"]


def test_tolerance_presets():
    from veomni_ops.spec import DEFAULT_TOLERANCES, ELEMENTWISE, MATMUL

    assert dict(ELEMENTWISE) == {d: DEFAULT_TOLERANCES[d] for d in ("float32", "bfloat16", "float16")}
    assert dict(MATMUL) == {
        "float32": Tolerance(1e-4, 1e-4), "bfloat16": Tolerance(2e-2, 2e-2), "float16": Tolerance(5e-3, 5e-3),
    }


def test_spec_defaults_declare_a_kernel_with_overrides():
    from veomni_ops.spec import ELEMENTWISE, MATMUL, SpecDefaults

    mine = SpecDefaults(name="mine", kernels="my_backend.kernels", hardware=HardwareRequirement(("cuda",)),
                        requires=("lib>=1",), priority=7, tolerances=ELEMENTWISE, install_hint="pip install lib")
    spec = mine.spec("rms_norm", "offset", "rms_norm:offset", "an RMSNorm")
    assert spec == KernelSpec(
        name="mine", op="rms_norm", variant="offset", factory="my_backend.kernels.rms_norm:offset",
        hardware=HardwareRequirement(("cuda",)), requires=("lib>=1",), priority=7, tolerances=ELEMENTWISE,
        description="an RMSNorm", install_hint="pip install lib",
    )
    # Overrides win; a preset keeps only the dtypes the kernel takes; a callable factory stays as it is.
    factory = lambda: None  # noqa: E731
    other = mine.spec("cross_entropy", "fused_linear", factory, name="mine_fast", dtypes=("bfloat16",),
                      tolerances=MATMUL, parallel=())
    assert other.name == "mine_fast" and other.factory is factory and other.dtypes == ("bfloat16",)
    assert other.tolerances == (("bfloat16", MATMUL["bfloat16"]),)
    assert other.requires == ("lib>=1",) and other.priority == 7

    with pytest.raises(SpecError, match="unknown field.*op, variant, factory and description are each kernel's own"):
        SpecDefaults(name="mine", op="swiglu")
    with pytest.raises(SpecError, match=r"SpecDefaults.spec: unknown field\(s\) prority"):
        mine.spec("swiglu", "standard", "swiglu:silu_mul", prority=3)
