import warnings

import pytest
from veomni_ops import ConfigError, OpsConfig

VEOMNI_YAML = """
model:
  model_path: Qwen/Qwen3-8B
  ops_implementation:
    attn_implementation: flash_attention_2
    cross_entropy_loss_implementation: liger_kernel
    rms_norm_implementation: liger_kernel
    swiglu_mlp_implementation: liger_kernel
    rotary_pos_emb_implementation: liger_kernel
    moe_implementation: fused_triton
    load_balancing_loss_implementation: triton
train:
  micro_batch_size: 1
"""


def test_defaults_are_auto():
    cfg = OpsConfig()
    assert set(cfg.to_dict().values()) == {"auto"}


def test_veomni_yaml_loads_unchanged(tmp_path):
    p = tmp_path / "veomni.yaml"
    p.write_text(VEOMNI_YAML)
    with pytest.warns(DeprecationWarning) as rec:
        cfg = OpsConfig.from_yaml(p)
    assert cfg.attn_implementation == "flash_attention_2"
    assert cfg.rms_norm_implementation == "liger"
    assert cfg.cross_entropy_loss_implementation == "liger"
    assert cfg.moe_implementation == "triton"
    assert cfg.load_balancing_loss_implementation == "triton"
    msgs = " ".join(str(w.message) for w in rec)
    assert "moe_implementation: 'fused_triton' is a legacy VeOmni value; write moe_implementation: triton" in msgs


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("moe_implementation", "fused", "triton"),
        ("moe_implementation", "fused_quack", "quack"),
        ("moe_implementation", "fused_npu", "npu"),
        ("cross_entropy_loss_implementation", "chunk_loss", "chunked"),
        ("attn_implementation", "veomni_flash_attention_4_with_sp", "flash_attention_4"),
    ],
)
def test_legacy_values_map_with_warning(field, value, expected):
    with pytest.warns(DeprecationWarning, match=f"write {field}: {expected}"):
        assert getattr(OpsConfig(**{field: value}), field) == expected


def test_plain_dict_and_third_party_names():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = OpsConfig.from_dict({"rms_norm_implementation": "Acme-Norm", "attn_implementation": "sdpa"})
    assert cfg.rms_norm_implementation == "acme_norm" and cfg.attn_implementation == "sdpa"
    assert OpsConfig.from_dict({"moe_implementation": None}).moe_implementation == "eager"


def test_unknown_field_did_you_mean():
    with pytest.raises(ConfigError, match="unknown ops_implementation field 'rms_norm_impl'; did you mean 'rms_norm_implementation'"):
        OpsConfig.from_dict({"rms_norm_impl": "liger"})


def test_bad_values(tmp_path):
    with pytest.raises(ConfigError, match="must be a string kernel name, got int"):
        OpsConfig(rms_norm_implementation=3)
    with pytest.raises(ConfigError, match="is empty"):
        OpsConfig(rms_norm_implementation=" ")
    with pytest.raises(ConfigError, match="must be a mapping"):
        OpsConfig.from_dict(["liger"])
    p = tmp_path / "bad.yaml"
    p.write_text("model: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        OpsConfig.from_yaml(p)


@pytest.mark.parametrize("var", ["VEOMNI_USE_LIGER_KERNEL", "USE_GROUP_GEMM"])
def test_removed_env_vars_fail_with_fix(monkeypatch, var):
    monkeypatch.setenv(var, "1")
    with pytest.raises(ConfigError, match=f"{var} is set, but it was removed: set .*_implementation"):
        OpsConfig.from_dict({})
