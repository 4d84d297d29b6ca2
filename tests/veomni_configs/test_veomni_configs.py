"""VeOmni's own config files (core/tests/fixtures/veomni: each names its source file at VeOmni
commit d977449) planned with every first-party backend installed: every config but the NPU ones
for an H100 (cuda:9.0), the NPU ones for an Ascend NPU, from this CPU machine (no kernel
imported, requirements of the target not checked, as ``veomni-ops resolve --device`` plans).
plugins/veomni-npu/tests/test_veomni_npu_configs.py plans the NPU ones with their kernels
imported, against the stand-in torch_npu."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import veomni_ops
from veomni_ops import OpsConfig, ResolutionError
from veomni_ops.cli import main

FIXTURES = Path(__file__).parents[2] / "core" / "tests" / "fixtures" / "veomni"
CONFIGS = sorted(FIXTURES.glob("*.yaml"))
#: Configs that name NPU-only kernels (fused_npu, npu): not for a CUDA GPU, in VeOmni either.
NPU_ONLY = {"text__deepseek_v4_npu.yaml", "multimodal__qwen3_5_moe__qwen3_5_moe_vl_ascendc.yaml"}


def load(path: Path, **kw) -> OpsConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return OpsConfig.from_yaml(path, **kw)


def plan_for(cfg: OpsConfig, device: str):
    return veomni_ops.resolve(cfg, device, load=False, check_requires=False)


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name not in NPU_ONLY], ids=lambda p: p.stem)
def test_veomni_configs_plan_for_an_h100(path):
    cfg = load(path)
    plan = plan_for(cfg, "cuda:9.0")
    written = cfg.to_dict()
    for e in plan.entries:  # what the config names is what the plan has (VeOmni's names, read for cuda)
        asked = cfg.for_device("cuda:9.0").for_op(e.op)
        if asked != "auto":
            assert e.kernel == asked, (e.op, written)


@pytest.mark.parametrize("name, want", [
    ("text__gemma3.yaml", {("attention", "flex_attention", "veomni-ops")}),
    ("text__gpt_oss_120b_lora_ep4.yaml", {("attention", "flash_attention_4", "veomni-flash"),
                                          ("moe_experts", "quack", "veomni-quack")}),
    ("text__qwen3-moe.yaml", {("attention", "flash_attention_2", "veomni-flash"),
                              ("moe_experts", "triton", "veomni-triton")}),
    ("dit__flux_lora.yaml", {("attention", "flash_attention_3", "veomni-flash")}),
    ("text__deepseek_v4.yaml", {("attention", "eager", "veomni-ops"), ("moe_experts", "triton", "veomni-triton"),
                                ("cross_entropy", "liger", "veomni-liger"), ("rms_norm", "liger", "veomni-liger"),
                                ("swiglu", "liger", "veomni-liger"), ("rotary", "eager", "veomni-ops")}),
])
def test_what_veomnis_configs_get_on_an_h100(name, want):
    cfg = load(FIXTURES / name)
    got = {(e.op, e.kernel, e.distribution) for e in plan_for(cfg, "cuda:9.0").entries}
    assert want <= got


def test_deepseek_v4_keeps_its_veomni_only_fields_unmanaged():
    cfg = load(FIXTURES / "text__deepseek_v4.yaml")
    assert dict(cfg.unmanaged) == {"dsa_attention_implementation": "tilelang", "dsa_indexer_implementation": "tilelang",
                                   "mhc_implementation": "tilelang"}


@pytest.mark.parametrize("name", sorted(NPU_ONLY))
def test_npu_configs_are_refused_on_an_h100_for_their_npu_kernels_only(name):
    with pytest.raises(ResolutionError) as ei:
        plan_for(load(FIXTURES / name), "cuda:9.0")
    refused = {(r.op, r.requested) for r in ei.value.refusals}
    if name == "text__deepseek_v4_npu.yaml":
        assert refused == {("moe_experts", "npu"), ("cross_entropy", "npu")}
    else:
        assert refused == {("rms_norm", "npu"), ("rotary", "npu"), ("moe_experts", "npu")}


def test_deepseek_v4_npu_plans_for_an_npu():
    plan = plan_for(load(FIXTURES / "text__deepseek_v4_npu.yaml"), "npu")
    got = {(e.op, e.kernel, e.distribution) for e in plan.entries}
    assert ("moe_experts", "npu", "veomni-npu") in got
    assert ("cross_entropy", "chunked", "veomni-ops") in got  # VeOmni's 'npu' loss is its chunk_loss
    assert {k for op, k, _ in got if op not in ("moe_experts", "cross_entropy")} == {"eager"}


@pytest.mark.parametrize("name", sorted(NPU_ONLY))
def test_veomni_npu_configs_plan_for_an_npu(name):
    cfg = load(FIXTURES / name)
    plan = plan_for(cfg, "npu")
    for e in plan.entries:  # what the config names is what the plan has (VeOmni's names, read for an NPU)
        asked = cfg.for_device("npu").for_op(e.op)
        if asked != "auto":
            assert e.kernel == asked, (e.op, cfg.to_dict())


def test_qwen3_5_moe_ascendc_plans_for_an_npu_with_its_flash_attention():
    cfg = load(FIXTURES / "multimodal__qwen3_5_moe__qwen3_5_moe_vl_ascendc.yaml")
    plan = plan_for(cfg, "npu")
    got = {(e.op, e.kernel, e.distribution) for e in plan.entries}
    assert {("rms_norm", "npu", "veomni-npu"), ("rotary", "npu", "veomni-npu"), ("moe_experts", "npu", "veomni-npu"),
            ("cross_entropy", "chunked", "veomni-ops"), ("swiglu", "eager", "veomni-ops"),
            ("load_balancing_loss", "eager", "veomni-ops")} <= got
    # veomni_flash_attention_2_with_sp: VeOmni runs transformers' NPU flash attention there, npu_fusion_attention
    attention = plan.get("attention", "standard")
    assert (attention.kernel, attention.distribution, attention.requested) == ("npu", "veomni-npu", "flash_attention_2")
    assert "npu_fusion_attention" in attention.reason


def test_a_gpu_default_config_on_an_npu_follows_veomnis_rewrite():
    """VeOmni's GPU defaults, written out (as a VeOmni config that spells them): on an NPU each is
    what VeOmni rewrites it to, not a refusal."""
    cfg = load(FIXTURES / "text__qwen3-moe.yaml", defaults="veomni")
    got = {(e.op, e.kernel, e.distribution) for e in plan_for(cfg, "npu").entries}
    assert {("rms_norm", "npu", "veomni-npu"), ("rotary", "npu", "veomni-npu"), ("swiglu", "eager", "veomni-ops"),
            ("cross_entropy", "chunked", "veomni-ops"), ("moe_experts", "npu", "veomni-npu"),
            ("load_balancing_loss", "eager", "veomni-ops"), ("attention", "npu", "veomni-npu")} <= got


def test_resolve_defaults_veomni_on_the_command_line(capsys):
    path = str(FIXTURES / "text__qwen3.yaml")
    assert main(["resolve", path, "--device", "cuda:9.0", "--defaults", "veomni", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    kernels = {(e["op"], e["kernel"]) for e in out["entries"]}
    assert {("rms_norm", "liger"), ("swiglu", "liger"), ("cross_entropy", "liger"), ("moe_experts", "triton"),
            ("load_balancing_loss", "triton"), ("attention", "flash_attention_2")} <= kernels
    assert out["config"]["rms_norm_implementation"] == "liger_kernel"  # as VeOmni writes it
    assert main(["resolve", path, "--device", "cuda:9.0", "--json"]) == 0  # ours: auto
    out = json.loads(capsys.readouterr().out)
    assert {e["requested"] for e in out["entries"] if e["op"] != "attention"} == {"auto"}
