import json

import pytest
from conftest import make_plugin
from veomni_ops import KernelSpec, OpsConfig, ResolutionError, build_registry, parse_device, resolve
from veomni_ops.config import ConfigError
from veomni_ops.device import DeviceError

STD = {"rms_norm": ["standard"]}


def test_auto_picks_highest_priority_usable(toy_registry):
    plan = resolve(OpsConfig(), "cuda:9.0", registry=toy_registry, needs=STD)
    assert plan.get("rms_norm", "standard").kernel == "hopper"
    plan = resolve(OpsConfig(), "cuda:8.0", registry=toy_registry, needs=STD)
    e = plan.get("rms_norm", "standard")
    assert e.kernel == "portable"
    assert "passed over hopper (needs compute capability <= 9.0" not in e.reason  # 8.0 is below, not above
    assert "passed over hopper (needs compute capability >= 9.0, this device has 8.0)" in e.reason


def test_explicit_name_never_replaced(toy_registry):
    with pytest.raises(ResolutionError) as ei:
        resolve(OpsConfig(rms_norm_implementation="hopper"), "cpu", registry=toy_registry, needs=STD)
    msg = str(ei.value)
    assert "rms_norm_implementation='hopper' (op rms_norm, variant standard)" in msg
    assert "needs a cuda device, this is cpu" in msg
    assert "Usable here for rms_norm/standard: portable" in msg


def test_missing_variant_refused(toy_registry):
    with pytest.raises(ResolutionError, match="kernel 'hopper' provides variant\\(s\\) standard of rms_norm, but this needs offset"):
        resolve(OpsConfig(rms_norm_implementation="hopper"), "cuda:9.0", registry=toy_registry,
                needs={"rms_norm": ["offset"]})
    # auto takes the next kernel that has the variant, and says so
    plan = resolve(OpsConfig(), "cuda:9.0", registry=toy_registry, needs={"rms_norm": ["offset"]})
    assert plan.get("rms_norm", "offset").kernel == "portable"


def test_unknown_name_did_you_mean_and_install_hint(toy_registry):
    with pytest.raises(ResolutionError) as ei:
        resolve(OpsConfig(rms_norm_implementation="portabel", swiglu_mlp_implementation="liger"), "cpu",
                registry=toy_registry, needs={"rms_norm": ["standard"], "swiglu": ["standard"]})
    msg = str(ei.value)
    assert msg.startswith("cannot resolve 2 op(s) for device cpu:")  # all refusals together
    assert "no kernel 'portabel' is registered for rms_norm (did you mean 'portable'?)" in msg
    assert 'no kernel \'liger\' is registered for swiglu' in msg and 'pip install "veomni-ops[liger]"' in msg


def test_failed_plugin_is_chained():
    bad = make_plugin("liger")
    def rms_norm():
        raise RuntimeError("kaboom")
    from veomni_ops import hookimpl
    bad.rms_norm = hookimpl(rms_norm)
    reg = build_registry([("liger", bad)], include_entry_points=False, env={})
    assert reg.failures and reg.failures[0].phase == "hook:rms_norm"
    with pytest.raises(ResolutionError) as ei:
        resolve(OpsConfig(rms_norm_implementation="liger"), "cpu", registry=reg, needs=STD)
    assert "its plugin failed to load: plugin liger local (entry point 'liger') failed at hook:rms_norm: RuntimeError: kaboom" in str(ei.value)
    assert isinstance(ei.value.__cause__, RuntimeError)


def test_requirement_checked_from_metadata():
    p = make_plugin("p", swiglu=[
        KernelSpec(name="needy", op="swiglu", variant="standard", factory="math:sqrt", requires=("no-such-dist-xyz>=1",)),
        KernelSpec(name="old", op="swiglu", variant="standard", factory="math:sqrt", requires=("pluggy>=999",)),
    ])
    reg = build_registry([("p", p)], include_entry_points=False, env={})
    for name, text in [("needy", "requires no-such-dist-xyz>=1, which is not installed"),
                       ("old", "requires pluggy>=999, installed is pluggy ")]:
        with pytest.raises(ResolutionError, match=text):
            resolve(OpsConfig(swiglu_mlp_implementation=name), "cpu", registry=reg, needs={"swiglu": ["standard"]})


def test_factory_import_failure_is_a_refusal_with_cause():
    p = make_plugin("p", swiglu=[KernelSpec(name="ghost", op="swiglu", variant="standard", factory="no_such_module_xyz:f")])
    reg = build_registry([("p", p)], include_entry_points=False, env={})
    with pytest.raises(ResolutionError, match="its kernel failed to import \\(ModuleNotFoundError") as ei:
        resolve(OpsConfig(swiglu_mlp_implementation="ghost"), "cpu", registry=reg, needs={"swiglu": ["standard"]})
    assert isinstance(ei.value.__cause__, ModuleNotFoundError)
    # load=False checks everything but the import
    plan = resolve(OpsConfig(swiglu_mlp_implementation="ghost"), "cpu", registry=reg, needs={"swiglu": ["standard"]}, load=False)
    with pytest.raises(RuntimeError, match="resolved without loading kernels"):
        plan.kernel("swiglu", "standard")


def test_backward_and_dtype_filters():
    p = make_plugin("p", swiglu=[
        KernelSpec(name="fwdonly", op="swiglu", variant="standard", factory="math:sqrt", supports_backward=False, priority=5),
        KernelSpec(name="fp32only", op="swiglu", variant="standard", factory="math:sqrt", dtypes=("float32",), priority=3),
        KernelSpec(name="base", op="swiglu", variant="standard", factory="math:sqrt"),
    ])
    reg = build_registry([("p", p)], include_entry_points=False, env={})
    need = {"swiglu": ["standard"]}
    assert resolve(OpsConfig(), "cpu", registry=reg, needs=need).get("swiglu", "standard").kernel == "fp32only"
    assert resolve(OpsConfig(), "cpu", registry=reg, needs=need, dtype="bfloat16").get("swiglu", "standard").kernel == "base"
    assert resolve(OpsConfig(), "cpu", registry=reg, needs=need, training=False).get("swiglu", "standard").kernel == "fwdonly"
    with pytest.raises(ResolutionError, match="has no backward, and training needs one"):
        resolve(OpsConfig(swiglu_mlp_implementation="fwdonly"), "cpu", registry=reg, needs=need)


def test_alternative_variants_prefer_first():
    p = make_plugin("p", cross_entropy=[
        KernelSpec(name="k", op="cross_entropy", variant="logits", factory="math:sqrt"),
        KernelSpec(name="k", op="cross_entropy", variant="fused_linear", factory="math:floor"),
        KernelSpec(name="only_logits", op="cross_entropy", variant="logits", factory="math:sqrt"),
    ])
    reg = build_registry([("p", p)], include_entry_points=False, env={})
    need = {"cross_entropy": [("fused_linear", "logits")]}
    assert resolve(OpsConfig(cross_entropy_loss_implementation="k"), "cpu", registry=reg, needs=need).for_op("cross_entropy")[0].variant == "fused_linear"
    assert resolve(OpsConfig(cross_entropy_loss_implementation="only_logits"), "cpu", registry=reg, needs=need).for_op("cross_entropy")[0].variant == "logits"


def test_plan_is_frozen_and_prints(toy_registry):
    import math

    plan = resolve(OpsConfig(), "cpu", registry=toy_registry, needs={"rms_norm": ["standard", "offset"], "swiglu": ["standard"]})
    assert plan.kernel("swiglu", "standard") is math.ceil
    d = json.loads(plan.to_json())
    assert [e["kernel"] for e in d["entries"]] == ["portable", "portable", "portable"]
    assert d["device"]["type"] == "cpu"
    table = plan.table()
    assert "rms_norm" in table and "toy local" in table
    with pytest.raises(AttributeError):
        plan.entries = ()
    with pytest.raises(KeyError, match="the plan has no kernel for attention/standard"):
        plan.kernel("attention", "standard")


def test_without_needs_resolves_what_names_provide(toy_registry):
    plan = resolve(OpsConfig(rms_norm_implementation="hopper"), "cuda:9.0", registry=toy_registry, load=False)
    assert [(e.op, e.variant) for e in plan.entries if e.op == "rms_norm"] == [("rms_norm", "standard")]


def test_device_parsing():
    assert str(parse_device("cuda:sm90")) == "cuda:9.0"
    assert parse_device("rocm:9.4").capability == (9, 4)
    assert parse_device("NPU").type == "npu"
    with pytest.raises(DeviceError, match="unknown device 'tpu'"):
        parse_device("tpu")
    with pytest.raises(DeviceError, match="npu takes nothing after ':'.*: write npu$"):
        parse_device("npu:9.0")


@pytest.mark.parametrize("text,words", [
    # out of any real range: refused, saying what is valid
    ("cuda:99.0", "no cuda device has compute capability 99.0; valid: MAJOR.MINOR with MAJOR 3..12 and MINOR 0..9 "
                  "(7.0 V100"),
    ("cuda:9.12", "no cuda device has compute capability 9.12"),
    ("cuda:sm_20", "no cuda device has compute capability 2.0"),
    ("rocm:3.0", "no rocm device has compute capability 3.0; valid: MAJOR.MINOR with MAJOR 9..12"),
    # a torch device index is not a capability
    ("cuda:0", "'0' looks like a torch device index; here the part after ':' is the compute capability to plan for: "
               "write cuda (this machine's GPU) or cuda:MAJOR.MINOR"),
    ("cuda:hopper", "'hopper' is not a compute capability; write cuda:MAJOR.MINOR or cuda:smXY"),
    # device types without capabilities: the hint is for that type, not a cuda-shaped one
    ("cpu:1", "device 'cpu:1': cpu takes nothing after ':' (kernels declare device types, not chips or indices, "
              "for cpu): write cpu"),
    ("npu:910B", "device 'npu:910B': npu takes nothing after ':'"),
    ("mps:0", "write mps"),
    # 'gpu' names no device type: refused (as the job's train.device refuses it)
    ("gpu", "device 'gpu' does not say which kind of GPU: write cuda (NVIDIA), rocm (AMD) or xpu (Intel)"),
])
def test_device_refusals_say_what_is_valid_for_that_type(text, words):
    with pytest.raises(DeviceError) as e:
        parse_device(text)
    assert words in str(e.value)
    if not text.startswith(("cuda", "rocm", "gpu")):
        assert "cuda" not in str(e.value)


@pytest.mark.parametrize("text,cap", [("cuda:3.0", (3, 0)), ("cuda:12.1", (12, 1)), ("cuda:sm_100", (10, 0)),
                                      ("rocm:9.4", (9, 4)), ("rocm:11.0", (11, 0))])
def test_real_capabilities_parse(text, cap):
    assert parse_device(text).capability == cap


@pytest.fixture
def fake_h100(monkeypatch):
    """This process sees a CUDA GPU of capability 9.0 (torch.cuda patched, detection re-run;
    the cached detection is cleared again afterwards)."""
    import torch
    from veomni_ops import device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.delenv("VEOMNI_OPS_DEVICE", raising=False)
    device.detected_device.cache_clear()
    yield
    device.detected_device.cache_clear()


def test_cuda_without_capability_is_this_machines_gpu(monkeypatch, toy_registry, fake_h100):
    """resolve(cfg, device="cuda") on a machine with a GPU reads its capability (here a patched
    torch.cuda saying 9.0): the Hopper-only kernel is planned, not refused for "capability unknown"."""
    cfg = OpsConfig(rms_norm_implementation="hopper")
    for dev in ("cuda", "CUDA", None):
        plan = resolve(cfg, dev, registry=toy_registry, needs={"rms_norm": ["standard"]}, load=False)
        assert str(plan.device) == "cuda:9.0" and plan.device.name == "NVIDIA H100 80GB HBM3", dev
        assert not plan.device.overridden and plan.get("rms_norm", "standard").kernel == "hopper"
    monkeypatch.setenv("VEOMNI_OPS_DEVICE", "cuda")
    assert str(resolve(cfg, registry=toy_registry, needs={"rms_norm": ["standard"]}, load=False).device) == "cuda:9.0"
    # Another capability named explicitly is planned for that one; rocm is not this machine's type.
    with pytest.raises(ResolutionError, match="needs compute capability <= 9.0, this device has 10.0"):
        resolve(cfg, "cuda:10.0", registry=toy_registry, needs={"rms_norm": ["standard"]}, load=False)
    assert resolve({}, "rocm", registry=toy_registry, load=False).device.capability is None


def test_cuda_without_capability_on_a_machine_without_one_says_how_to_name_it(monkeypatch, toy_registry):
    import torch
    from veomni_ops import device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device, "detected_device", lambda: device.DeviceInfo("cpu", None, "cpu"))
    with pytest.raises(ResolutionError) as e:
        resolve(OpsConfig(rms_norm_implementation="hopper"), "cuda", registry=toy_registry,
                needs={"rms_norm": ["standard"]}, load=False)
    assert ("needs compute capability cuda sm 9.0, and the cuda device's capability is unknown (no cuda device here "
            "to read it from): name it, e.g. cuda:9.0") in str(e.value)


def test_device_env_override(monkeypatch, toy_registry):
    monkeypatch.setenv("VEOMNI_OPS_DEVICE", "cuda:9.0")
    plan = resolve(OpsConfig(), registry=toy_registry, needs=STD, load=False)
    assert plan.device.overridden and plan.get("rms_norm", "standard").kernel == "hopper"


def test_what_the_device_variable_changes_names_it(monkeypatch, toy_registry):
    """VEOMNI_OPS_DEVICE changes what resolution plans for, with nothing in the call or the job
    to show it: the plan, every refusal and a malformed value name the variable."""
    from veomni_ops.device import DeviceError

    monkeypatch.setenv("VEOMNI_OPS_DEVICE", "cuda:9.0")
    plan = resolve(OpsConfig(), registry=toy_registry, needs=STD, load=False)
    assert plan.table().startswith("KernelPlan for cuda:9.0 (from VEOMNI_OPS_DEVICE=cuda:9.0), mode")
    with pytest.raises(ResolutionError) as ei:
        resolve(OpsConfig(rms_norm_implementation="hopper"), "cuda:10.0", registry=toy_registry, needs=STD,
                load=False)
    assert str(ei.value).startswith("cannot resolve 1 op(s) for device cuda:10.0:\n")  # given by the caller
    monkeypatch.setenv("VEOMNI_OPS_DEVICE", "cuda:10.0")
    with pytest.raises(ResolutionError) as ei:
        resolve(OpsConfig(rms_norm_implementation="hopper"), registry=toy_registry, needs=STD, load=False)
    assert str(ei.value).startswith("cannot resolve 1 op(s) for device cuda:10.0 (from VEOMNI_OPS_DEVICE):\n")
    assert "needs compute capability <= 9.0, this device has 10.0" in str(ei.value)
    with pytest.raises(ConfigError, match=r"resolving its other fields for device cuda:10\.0 \(from "
                                          r"VEOMNI_OPS_DEVICE\)"):
        resolve({"rms_norm_implementation": "hopper", "swiglu_mlp_implementation": 3}, registry=toy_registry,
                needs=STD, load=False)
    monkeypatch.setenv("VEOMNI_OPS_DEVICE", "cuda:9")
    with pytest.raises(DeviceError, match=r"^VEOMNI_OPS_DEVICE='cuda:9' \(set in the environment\): device 'cuda:9': "
                                          r"'9' looks like a torch device index.*; or unset VEOMNI_OPS_DEVICE"):
        resolve(OpsConfig(), registry=toy_registry, needs=STD, load=False)


def test_refusals_are_typed_and_the_hint_follows_the_kind(toy_registry):
    from veomni_ops.resolve import RefusalKind

    cases = [
        ({"rms_norm_implementation": "hopper"}, RefusalKind.DEVICE, "Pick a kernel that runs on cpu, or 'auto'."),
        ({"rms_norm_implementation": "portabel"}, RefusalKind.UNKNOWN_NAME, "To get it: install the distribution"),
    ]
    for cfg, kind, how in cases:
        with pytest.raises(ResolutionError) as ei:
            resolve(cfg, "cpu", registry=toy_registry, needs=STD)
        (r,) = ei.value.refusals
        assert r.kind is kind and r.how.startswith(how), r
    with pytest.raises(ResolutionError) as ei:
        resolve({"rms_norm_implementation": "portable"}, "cpu", registry=toy_registry, needs={"rms_norm": ["standard"]},
                dtype="float64")
    assert ei.value.refusals[0].kind is RefusalKind.DTYPE and ei.value.refusals[0].how == ""


def test_an_import_failure_that_mentions_requires_gets_no_install_hint(monkeypatch):
    """The hint follows the kind of refusal, not words in the reason: an ImportError whose text
    says "requires" is an import failure, not a missing requirement."""
    from veomni_ops.resolve import RefusalKind

    monkeypatch.delenv("VEOMNI_OPS_STRICT", raising=False)

    def broken():
        raise ImportError("this kernel requires a GPU build")

    p = make_plugin("p", swiglu=[KernelSpec(name="brk", op="swiglu", variant="standard", factory=broken,
                                            install_hint="pip install brk-extras")])
    reg = build_registry([("p", p)], include_entry_points=False, env={})
    with pytest.raises(ResolutionError) as ei:
        resolve({"swiglu_mlp_implementation": "brk"}, "cpu", registry=reg, needs={"swiglu": ["standard"]})
    (r,) = ei.value.refusals
    assert r.kind is RefusalKind.IMPORT and "requires a GPU build" in r.why
    assert "pip install brk-extras" not in str(ei.value)


def test_our_extras_are_read_from_the_core_metadata():
    from veomni_ops.registry import FIRST_PARTY_DISTRIBUTIONS, extra_of, first_party_extra, plugin_extras

    extras = plugin_extras()
    assert set(extras.values()) == set(FIRST_PARTY_DISTRIBUTIONS), extras
    assert first_party_extra("flash_attention_4") == ("flash", "veomni-flash")
    assert first_party_extra("triton_batch_invariant") == ("triton", "veomni-triton")
    assert first_party_extra("portable") is None
    assert extra_of("veomni_liger") == "liger"


def test_a_plan_entry_references_its_registered_kernel(toy_registry):
    e = resolve(OpsConfig(), "cpu", registry=toy_registry, needs=STD).get("rms_norm", "standard")
    rk = toy_registry.get("rms_norm", "standard", "portable")
    assert e.registered is rk and e.spec is rk.spec
    assert (e.op, e.variant, e.kernel, e.distribution, e.version) == ("rms_norm", "standard", "portable", "toy", "local")
    assert repr(e).startswith("PlanEntry(op='rms_norm', variant='standard', requested='auto', kernel='portable', ")
