"""VeOmni's own NPU configs (the core's fixtures, each naming its source file at VeOmni commit
d977449) plan for an Ascend NPU with only the core and this backend installed, every kernel
imported (against the stand-in torch_npu) and torch-npu's requirement checked, as on an NPU
machine. (tests/veomni_configs plans every VeOmni config with every backend, without importing.)"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import veomni_npu.specs as specs
import veomni_ops.backends.reference
from veomni_ops import OpsConfig, build_registry, resolve

FIXTURES = Path(__file__).resolve().parents[3] / "core" / "tests" / "fixtures" / "veomni"
#: The VeOmni configs written for an Ascend NPU (they name NPU kernels: fused_npu, npu).
NPU_CONFIGS = ["text__deepseek_v4_npu.yaml", "multimodal__qwen3_5_moe__qwen3_5_moe_vl_ascendc.yaml"]


def registry():
    return build_registry(modules=[("eager", veomni_ops.backends.reference), ("veomni-npu", specs)],
                          include_entry_points=False, env={})


def load(name: str) -> OpsConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # VeOmni's legacy spellings (fused_npu, *_with_sp) warn when read
        return OpsConfig.from_yaml(FIXTURES / name)


def test_the_npu_configs_are_the_ones_naming_npu_kernels():
    for path in sorted(FIXTURES.glob("*.yaml")):
        names_npu = "npu" in set(load(path.name).to_dict().values())
        assert names_npu == (path.name in NPU_CONFIGS), path.name


@pytest.mark.parametrize("name", NPU_CONFIGS)
def test_veomni_npu_configs_plan_for_an_npu_with_their_kernels_loaded(name):
    cfg = load(name)
    plan = resolve(cfg, "npu", registry=registry(), load=True, check_requires=True)
    here = cfg.for_device("npu")
    for e in plan.entries:
        asked = here.for_op(e.op)
        if asked != "auto":
            assert e.kernel == asked, (e.op, cfg.to_dict())
        assert callable(e.fn)
    got = {(e.op, e.kernel) for e in plan.entries}
    assert ("moe_experts", "npu") in got and ("cross_entropy", "chunked") in got
    if name.startswith("multimodal__qwen3_5_moe"):
        # veomni_flash_attention_2_with_sp: transformers' NPU flash attention in VeOmni, npu_fusion_attention here
        attention = plan.get("attention", "standard")
        assert attention.kernel == "npu" and attention.fn.__module__ == "veomni_npu.kernels.attention"
        assert {("rms_norm", "npu"), ("rotary", "npu")} <= got
