"""VeOmni's configs and values (issue 25): VeOmni's own config files load (with an ops block or
without), device-dependent values mean per device what they mean in VeOmni, VeOmni's defaults
can be asked for, and VeOmni kernels veomni-ops lacks are refused saying what they are. The
planning of every VeOmni config with every first-party backend installed is in
tests/veomni_configs/ (the integration session); here only the core is installed."""

from __future__ import annotations

import sys
import types
import warnings
from pathlib import Path

import pytest
import veomni_ops
from veomni_ops import ConfigError, HardwareRequirement, KernelSpec, OpsConfig, ResolutionError, hookimpl
from veomni_ops.backends import reference
from veomni_ops.config import FIELD_TO_OP, LegacyValueWarning
from veomni_ops.discovery import build_registry
from veomni_ops.registry import extra_of
from veomni_ops.spec import OPS
from veomni_ops.veomni import DEVICE_VALUES, NOT_IN_VEOMNI, NOT_PROVIDED, VEOMNI_DEFAULTS

FIXTURES = Path(__file__).parent / "fixtures" / "veomni"
CONFIGS = sorted(FIXTURES.glob("*.yaml"))
#: VeOmni's configs with no ops_implementation block (every field at its default).
WITHOUT_OPS = {"text__llama3.yaml", "text__seed_oss.yaml", "multimodal__qwen2_vl__qwen2_vl.yaml",
               "multimodal__qwen25_omni__qwen25_omni.yaml", "multimodal__omni__seed_omni.yaml",
               "multimodal__decoder__movqgan__fsdp2_align_qwenvit_imagenet.yaml"}
#: VeOmni's _NPU_DEFAULT_FALLBACK (arguments_types.py:979-987), in our kernel names.
NPU_REWRITE = {"rms_norm_implementation": "npu", "rotary_pos_emb_implementation": "npu",
               "swiglu_mlp_implementation": "eager", "load_balancing_loss_implementation": "eager",
               "cross_entropy_loss_implementation": "chunked", "moe_implementation": "npu"}


def core_registry(*extra):
    return build_registry(modules=[("eager", reference), *extra], include_entry_points=False, env={})


def load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyValueWarning)
        warnings.simplefilter("ignore", UserWarning)
        return OpsConfig.from_yaml(path, **kw)


def test_fixtures_are_veomni_configs_naming_their_source():
    assert len(CONFIGS) == 41
    for path in CONFIGS:
        head = path.read_text().splitlines()[0]
        source = "configs/" + path.stem.replace("__", "/") + ".yaml"
        assert head.startswith(f"# Source: ByteDance-Seed/VeOmni, {source} at commit d977449"), path.name


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_veomni_config_loads(path):
    cfg = load(path)
    if path.name in WITHOUT_OPS:
        assert cfg == OpsConfig()  # a whole config without an ops block: every field auto


def test_a_whole_config_without_an_ops_block_is_every_default():
    # was: "unknown field 'model'"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert OpsConfig.from_yaml(FIXTURES / "text__llama3.yaml") == OpsConfig()
        assert OpsConfig.from_dict({"model": None, "train": {}}) == OpsConfig()
        assert OpsConfig.from_dict({"model": {"model_path": "x", "ops_implementation": None}}) == OpsConfig()
    assert veomni_ops.resolve(FIXTURES / "text__llama3.yaml", "cpu", registry=core_registry()).config == OpsConfig()


@pytest.mark.parametrize("op, value", [(op, v) for op, table in DEVICE_VALUES.items() for v in table])
def test_device_dependent_values_are_kept_and_read_per_device(op, value):
    field = next(f for f, o in FIELD_TO_OP.items() if o == op)
    choice = DEVICE_VALUES[op][value]
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        cfg = OpsConfig(**{field: value})
    assert getattr(cfg, field) == value  # kept as written
    said = [str(w.message) for w in rec if issubclass(w.category, LegacyValueWarning)]
    assert bool(said) == choice.legacy  # a VeOmni spelling warns, saying what it is per device
    if choice.legacy:
        assert f"{value!r} is a legacy VeOmni value" in said[0] and choice.npu in said[0]
    assert getattr(cfg.for_device("npu"), field) == choice.npu
    assert getattr(cfg.for_device("cuda:9.0"), field) == (choice.other or value)
    assert getattr(cfg.for_device("cpu"), field) == (choice.other or value)


def test_legacy_values_qualified_by_a_distribution_map_as_before():
    with pytest.warns(LegacyValueWarning, match="write rms_norm_implementation: liger@veomni-liger"):
        cfg = OpsConfig(rms_norm_implementation="liger_kernel@veomni-liger")
    assert cfg.for_device("npu").rms_norm_implementation == "liger@veomni-liger"  # a distribution named: no rewrite


def test_a_value_is_warned_about_once_not_at_every_copy():
    with pytest.warns(LegacyValueWarning):
        cfg = OpsConfig.from_dict({"moe_implementation": "fused"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg.for_device("npu")
        cfg.for_device("cuda")
        import dataclasses
        assert dataclasses.replace(cfg, rms_norm_implementation="eager").moe_implementation == "fused"


def test_veomni_defaults():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked for: no legacy warnings
        cfg = OpsConfig.veomni_defaults()
        assert cfg.to_dict() == VEOMNI_DEFAULTS
        assert set(NOT_IN_VEOMNI) == {"moe_router_implementation", "residual_rms_norm_implementation"}
        assert all(VEOMNI_DEFAULTS[f] == "eager" for f in NOT_IN_VEOMNI)  # the model's own code, as VeOmni runs
        assert OpsConfig.veomni_defaults(attn_implementation="sdpa").attn_implementation == "sdpa"
        gpu = cfg.for_device("cuda:9.0").to_dict()
    assert gpu == {"attn_implementation": "flash_attention_2", "rms_norm_implementation": "liger",
                   "rotary_pos_emb_implementation": "liger", "swiglu_mlp_implementation": "liger",
                   "cross_entropy_loss_implementation": "liger", "moe_implementation": "triton",
                   "load_balancing_loss_implementation": "triton", "moe_router_implementation": "eager",
                   "residual_rms_norm_implementation": "eager"}
    npu = cfg.for_device("npu").to_dict()
    assert npu == {**NPU_REWRITE, "attn_implementation": "npu", "moe_router_implementation": "eager",
                   "residual_rms_norm_implementation": "eager"}  # VeOmni's flash attention there: npu_fusion_attention
    # a whole VeOmni config with defaults=veomni: what it writes, and VeOmni's defaults for the rest
    qwen3_moe = load(FIXTURES / "text__qwen3-moe.yaml", defaults="veomni")
    assert qwen3_moe.to_dict() == {**VEOMNI_DEFAULTS, "attn_implementation": "flash_attention_2",
                                   "moe_implementation": "fused_triton"}
    lora = load(FIXTURES / "text__qwen3_lora.yaml", defaults="veomni")
    assert lora.cross_entropy_loss_implementation == "eager" and lora.moe_implementation == "fused_triton"
    with pytest.raises(ConfigError, match="defaults must be one of 'auto', 'veomni', got 'gpu'"):
        OpsConfig.from_dict({}, defaults="gpu")


def test_veomni_gpu_defaults_on_npu_follow_veomnis_rewrite_in_the_plan():
    # only the core here: the NPU kernels are not installed, so plan the ops whose NPU choice is the core's
    cfg = OpsConfig.veomni_defaults()
    needs = {"swiglu": ["standard"], "load_balancing_loss": ["standard"], "cross_entropy": ["fused_linear"]}
    plan = veomni_ops.resolve(cfg, "npu", needs=needs, registry=core_registry(), load=False)
    got = {(e.op, e.kernel, e.requested) for e in plan.entries}
    assert got == {("swiglu", "eager", "liger_kernel"), ("load_balancing_loss", "eager", "triton"),
                   ("cross_entropy", "chunked", "liger_kernel")}
    lbl = plan.get("load_balancing_loss", "standard")
    assert "requested as 'triton', which is eager on npu: VeOmni's GPU default" in lbl.reason
    assert "arguments_types.py:984" in lbl.reason


def test_cross_entropy_npu_is_chunked_on_an_npu_and_refused_elsewhere():
    with pytest.warns(LegacyValueWarning, match="write cross_entropy_loss_implementation: chunked"):
        cfg = OpsConfig(cross_entropy_loss_implementation="npu")
    needs = {"cross_entropy": ["fused_linear"]}
    plan = veomni_ops.resolve(cfg, "npu", needs=needs, registry=core_registry(), load=False)
    entry = plan.get("cross_entropy", "fused_linear")
    assert (entry.kernel, entry.requested) == ("chunked", "npu")
    assert "VeOmni's chunk_loss" in entry.reason
    with pytest.raises(ResolutionError) as ei:
        veomni_ops.resolve(cfg, "cuda:9.0", needs=needs, registry=core_registry(), load=False)
    (r,) = ei.value.refusals
    assert r.requested == "npu" and "requires an Ascend NPU" in r.why
    assert r.how == ("Write cross_entropy_loss_implementation: chunked, the kernel it is on an Ascend NPU "
                     "(it runs on cuda too).")


def test_moe_fused_is_quack_off_npu_and_npu_on_one():
    with pytest.warns(LegacyValueWarning, match="write moe_implementation: quack .or npu on an Ascend NPU."):
        cfg = OpsConfig(moe_implementation="fused")
    needs = {"moe_experts": ["standard"]}
    for dev, kernel in (("cuda:9.0", "quack"), ("npu", "npu")):
        with pytest.raises(ResolutionError) as ei:  # neither backend is installed in the core session
            veomni_ops.resolve(cfg, dev, needs=needs, registry=core_registry(), load=False)
        (r,) = ei.value.refusals
        assert r.requested == "fused" and f"no kernel {kernel!r} is registered" in r.why
        assert "VeOmni's deprecated alias" in r.why


@pytest.mark.parametrize("value, says", [
    ("magi_attention", "MagiAttention's FFA kernels"),
    ("veomni_magi_attention_with_sp", "MagiAttention's FFA kernels"),
    ("native-sparse", "no kernel behind it"),
])
def test_veomni_attention_we_do_not_provide_is_refused_saying_what_it_is(value, says):
    with pytest.raises(ResolutionError) as ei:
        veomni_ops.resolve({"attn_implementation": value}, "cuda:9.0", needs={"attention": ["standard"]},
                           registry=core_registry(), load=False)
    (r,) = ei.value.refusals
    assert says in r.why and "veomni-ops provides no such kernel: write attn_implementation:" in r.why
    text = r.describe()
    assert "In VeOmni this is" in text and "it needs" in text and "To get it" not in text


@pytest.mark.parametrize("value", ["fused_mlu", "fused_mlu_triton"])
def test_veomni_0_1_12_mlu_experts_are_refused(value):
    with pytest.raises(ResolutionError, match="Cambricon MLU"):
        veomni_ops.resolve({"moe_implementation": value}, "cuda:9.0", needs={"moe_experts": ["standard"]},
                           registry=core_registry(), load=False)


@pytest.mark.parametrize("value", ["flash_attention_2", "flash_attention_3", "flash_attention_4"])
def test_flash_attention_on_an_npu_is_veomni_npus_kernel(value):
    # only the core here: veomni-npu, which provides the kernel, is not installed
    with pytest.raises(ResolutionError) as ei:
        veomni_ops.resolve({"attn_implementation": value}, "npu", needs={"attention": ["standard"]},
                           registry=core_registry(), load=False)
    (r,) = ei.value.refusals
    assert r.requested == value and "no kernel 'npu' is registered" in r.why
    assert "npu_fusion_attention" in r.why and 'veomni-ops[npu]' in r.how
    assert not DEVICE_VALUES["attention"][value].legacy  # our own name too: no warning when loaded
    # off an NPU flash_attention_2 is veomni-flash's kernel: no VeOmni note there
    with pytest.raises(ResolutionError) as ei:
        veomni_ops.resolve({"attn_implementation": "flash_attention_2"}, "cuda:9.0",
                           needs={"attention": ["standard"]}, registry=core_registry(), load=False)
    assert "npu_fusion_attention" not in str(ei.value)


def test_flash_attention_on_an_npu_plans_the_npu_kernel_where_one_is_registered():
    mod = types.ModuleType("npu_attention_probe_specs")
    sys.modules[mod.__name__] = mod

    @hookimpl
    def attention():
        return [KernelSpec(name="npu", op="attention", variant="standard", hardware=HardwareRequirement(("npu",)),
                           factory="veomni_ops.kernels.attention:sdpa_attention")]

    mod.attention = attention
    with pytest.warns(LegacyValueWarning, match="write attn_implementation: flash_attention_2"):
        plan = veomni_ops.resolve({"attn_implementation": "veomni_flash_attention_2_with_sp"}, "npu",
                                  needs={"attention": ["standard"]}, registry=core_registry(("npu-probe", mod)),
                                  load=False)
    entry = plan.get("attention", "standard")
    assert (entry.kernel, entry.requested) == ("npu", "flash_attention_2")
    assert "which is npu on npu" in entry.reason


def test_a_plugin_that_provides_a_veomni_name_is_taken():
    mod = types.ModuleType("magi_probe_specs")
    sys.modules[mod.__name__] = mod

    @hookimpl
    def attention():
        return [KernelSpec(name="magi_attention", op="attention", variant="standard",
                           factory="veomni_ops.kernels.attention:sdpa_attention", hardware=reference.ANYWHERE)]

    mod.attention = attention
    plan = veomni_ops.resolve({"attn_implementation": "magi_attention"}, "cpu", needs={"attention": ["standard"]},
                              registry=core_registry(("magi", mod)), load=False)
    assert plan.get("attention", "standard").kernel == "magi_attention"


def test_every_not_provided_entry_says_what_to_write():
    for op, table in NOT_PROVIDED.items():
        field = next(f for f, o in FIELD_TO_OP.items() if o == op)
        for entry in table.values():
            assert f"write {field}:" in entry.describe()


#: Every VeOmni value whose meaning veomni-ops maps (a legacy spelling, or a kernel that depends on
#: the device), as docs/veomni-values.md documents it: per device, the kernel it is there and the
#: distribution that provides it (None: refused there, as VeOmni refuses it, or the kernel cannot
#: run there). Written out from the doc, not read from veomni_ops.veomni / the op folders, so that
#: a wrong mapping there fails here.
DOCUMENTED = {
    ("attn_implementation", "veomni_flash_attention_2_with_sp"): {
        "cuda:9.0": ("flash_attention_2", "veomni-flash"), "npu": ("npu", "veomni-npu")},
    ("attn_implementation", "veomni_flash_attention_3_with_sp"): {
        "cuda:9.0": ("flash_attention_3", "veomni-flash"), "npu": ("npu", "veomni-npu")},
    ("attn_implementation", "veomni_flash_attention_4_with_sp"): {
        "cuda:9.0": ("flash_attention_4", "veomni-flash"), "npu": ("npu", "veomni-npu")},
    ("attn_implementation", "flash_attention_2"): {
        "cuda:9.0": ("flash_attention_2", "veomni-flash"), "npu": ("npu", "veomni-npu")},
    ("attn_implementation", "flash_attention_3"): {
        "cuda:9.0": ("flash_attention_3", "veomni-flash"), "npu": ("npu", "veomni-npu")},
    ("attn_implementation", "flash_attention_4"): {
        "cuda:9.0": ("flash_attention_4", "veomni-flash"), "npu": ("npu", "veomni-npu")},
    ("attn_implementation", "veomni_flex_attention_with_sp"): {
        "cuda:9.0": ("flex_attention", "veomni-ops"), "npu": ("flex_attention", None)},  # FlexAttention: CUDA
    ("moe_implementation", "fused_triton"): {"cuda:9.0": ("triton", "veomni-triton"), "npu": ("npu", "veomni-npu")},
    ("moe_implementation", "fused_quack"): {"cuda:9.0": ("quack", "veomni-quack"), "npu": ("quack", None)},
    ("moe_implementation", "fused_npu"): {"cuda:9.0": ("npu", None), "npu": ("npu", "veomni-npu")},
    ("moe_implementation", "fused"): {"cuda:9.0": ("quack", "veomni-quack"), "npu": ("npu", "veomni-npu")},
    ("cross_entropy_loss_implementation", "liger_kernel"): {
        "cuda:9.0": ("liger", "veomni-liger"), "npu": ("chunked", "veomni-ops")},
    ("cross_entropy_loss_implementation", "chunk_loss"): {
        "cuda:9.0": ("chunked", "veomni-ops"), "npu": ("chunked", "veomni-ops")},
    ("cross_entropy_loss_implementation", "npu"): {"cuda:9.0": ("npu", None), "npu": ("chunked", "veomni-ops")},
    ("rms_norm_implementation", "liger_kernel"): {"cuda:9.0": ("liger", "veomni-liger"), "npu": ("npu", "veomni-npu")},
    ("swiglu_mlp_implementation", "liger_kernel"): {
        "cuda:9.0": ("liger", "veomni-liger"), "npu": ("eager", "veomni-ops")},
    ("rotary_pos_emb_implementation", "liger_kernel"): {
        "cuda:9.0": ("liger", "veomni-liger"), "npu": ("npu", "veomni-npu")},
    ("load_balancing_loss_implementation", "triton"): {
        "cuda:9.0": ("triton", "veomni-triton"), "npu": ("eager", "veomni-ops")},
}

#: A distribution-qualified legacy value is that distribution's kernel on every device (the doc:
#: naming the distribution opts out of VeOmni's rewrite).
DOCUMENTED_QUALIFIED = {
    ("attn_implementation", "veomni_flash_attention_2_with_sp@veomni-flash"): "flash_attention_2@veomni-flash",
    ("attn_implementation", "veomni_flex_attention_with_sp@veomni-ops"): "flex_attention@veomni-ops",
    ("moe_implementation", "fused_triton@veomni-triton"): "triton@veomni-triton",
    ("moe_implementation", "fused_quack@veomni-quack"): "quack@veomni-quack",
    ("moe_implementation", "fused_npu@veomni-npu"): "npu@veomni-npu",
    ("moe_implementation", "fused@veomni-quack"): "quack@veomni-quack",
    ("cross_entropy_loss_implementation", "liger_kernel@veomni-liger"): "liger@veomni-liger",
    ("cross_entropy_loss_implementation", "chunk_loss@veomni-ops"): "chunked@veomni-ops",
    ("rms_norm_implementation", "liger_kernel@veomni-liger"): "liger@veomni-liger",
    ("swiglu_mlp_implementation", "liger_kernel@veomni-liger"): "liger@veomni-liger",
    ("rotary_pos_emb_implementation", "liger_kernel@veomni-liger"): "liger@veomni-liger",
}


def test_every_mapped_veomni_value_is_documented_here():
    """A VeOmni value the code maps (an op folder's legacy table, veomni.DEVICE_VALUES) must be in
    DOCUMENTED, so that its mapping is checked against the doc."""
    from veomni_ops.ops import OP_DEFS

    field_of = {op: f for f, op in FIELD_TO_OP.items()}
    mapped = {(field_of[op], v) for op, d in OP_DEFS.items() for v in d.legacy}
    mapped |= {(field_of[op], v) for op, table in DEVICE_VALUES.items() for v in table}
    assert mapped <= set(DOCUMENTED), sorted(mapped - set(DOCUMENTED))


@pytest.mark.parametrize("device", ["cuda:9.0", "npu"])
@pytest.mark.parametrize("field, value", list(DOCUMENTED), ids=lambda x: str(x))
def test_each_veomni_value_is_its_documented_kernel_from_its_distribution(field, value, device):
    """The config reads the value as the documented kernel on ``device``, and the plan takes that
    kernel from the documented distribution: with the installed registry (every backend in the
    integration session, the core alone here), the plan entry where the distribution is installed,
    else a refusal of that name whose fix installs that distribution."""
    kernel, dist = DOCUMENTED[(field, value)][device]
    op = FIELD_TO_OP[field]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyValueWarning)
        cfg = OpsConfig(**{field: value})
    assert getattr(cfg.for_device(device), field) == kernel
    registry = build_registry(env={})  # the installed backends
    needs = {op: ["fused_linear" if op == "cross_entropy" else OPS[op][0]]}
    try:
        plan = veomni_ops.resolve(cfg, device, needs=needs, registry=registry, load=False, check_requires=False)
    except ResolutionError as e:
        (r,) = e.refusals
        assert r.requested == getattr(cfg, field)
        if dist is not None:  # documented to run there: refused only because its distribution is not installed
            assert f"no kernel {kernel!r} is registered for {op}" in r.why, r.why
            assert not any(k.spec.name == kernel and k.provenance.distribution == dist for k in registry.for_op(op))
            assert f"plugins/{dist}" in r.how or f"veomni-ops[{extra_of(dist)}]" in r.how, r.how
        return
    assert dist is not None, f"{value!r} was planned on {device}, where the doc says it is refused"
    (entry,) = plan.entries
    assert (entry.kernel, entry.distribution, entry.requested) == (kernel, dist, getattr(cfg, field))


@pytest.mark.parametrize("field, value", list(DOCUMENTED_QUALIFIED), ids=lambda x: str(x))
def test_a_qualified_veomni_value_is_that_distributions_kernel_on_every_device(field, value):
    with pytest.warns(LegacyValueWarning):
        cfg = OpsConfig(**{field: value})
    for device in ("cuda:9.0", "npu", "cpu"):
        assert getattr(cfg.for_device(device), field) == DOCUMENTED_QUALIFIED[(field, value)], device
