import warnings

import pytest
from veomni_ops import ConfigError, OpsConfig, resolve
from veomni_ops.config import FIELD_TO_OP, UNMANAGED_FIELDS, LegacyValueWarning, UnmanagedFieldWarning

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
    # VeOmni's GPU defaults are kept as written: which kernel each is depends on the device
    on_gpu = cfg.for_device("cuda:9.0")
    assert on_gpu.rms_norm_implementation == "liger" and on_gpu.cross_entropy_loss_implementation == "liger"
    assert on_gpu.moe_implementation == "triton" and on_gpu.load_balancing_loss_implementation == "triton"
    msgs = " ".join(str(w.message) for w in rec)
    assert "moe_implementation: 'fused_triton' is a legacy VeOmni value; write moe_implementation: triton" in msgs


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("moe_implementation", "fused_npu", "npu"),
        ("moe_implementation", "fused_quack", "quack"),
        ("cross_entropy_loss_implementation", "chunk_loss", "chunked"),
        ("attn_implementation", "veomni_flash_attention_4_with_sp", "flash_attention_4"),
        ("attn_implementation", "veomni_flex_attention_with_sp", "flex_attention"),
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


# ----------------------------------------------------------------------------------------
# every problem at once; "did you mean" only when close
# ----------------------------------------------------------------------------------------


def test_unknown_fields_and_bad_values_are_reported_together():
    with pytest.raises(ConfigError) as ei:
        OpsConfig.from_dict({"rms_norm_impl": "liger", "foo_implementation": "x", "swiglu_mlp_implementation": 3,
                             "attn_implementation": " "})
    msg = str(ei.value)
    assert msg.startswith("4 problems in ops_implementation:\n  - ")
    assert len(ei.value.problems) == 4
    assert "'rms_norm_impl'; did you mean 'rms_norm_implementation'?" in msg
    assert "unknown ops_implementation field 'foo_implementation'" in msg
    assert "swiglu_mlp_implementation must be a string kernel name, got int 3" in msg
    assert "attn_implementation is empty" in msg


def test_bad_values_of_one_config_are_reported_together():
    with pytest.raises(ConfigError) as ei:
        OpsConfig(rms_norm_implementation=3, moe_implementation="1nvalid")
    assert len(ei.value.problems) == 2
    assert "rms_norm_implementation must be a string" in str(ei.value) and "moe_implementation:" in str(ei.value)


@pytest.mark.parametrize("key,guess", [
    ("rms_norm_impl", "rms_norm_implementation"),
    ("rmsnorm_implementation", "rms_norm_implementation"),
    ("attention_implementation", "attn_implementation"),
    ("rope_implementation", "rotary_pos_emb_implementation"),
    ("moe_experts_implementation", "moe_implementation"),
    ("causal_conv_1d_implementation", "causal_conv1d_implementation"),
    ("rms_norm_implmentation", "rms_norm_implementation"),
    ("swiglu_mlp_implementaton", "swiglu_mlp_implementation"),
])
def test_did_you_mean_when_close(key, guess):
    with pytest.raises(ConfigError, match=f"unknown ops_implementation field '{key}'; did you mean '{guess}'"):
        OpsConfig.from_dict({key: "eager"})


@pytest.mark.parametrize("key", ["foo_implementation", "gdn_implementation", "ce_implementation", "use_liger"])
def test_no_did_you_mean_when_not_close(key):
    # Sharing the "_implementation" suffix is not closeness ("foo_implementation" is not "moe_implementation").
    with pytest.raises(ConfigError) as ei:
        OpsConfig.from_dict({key: "eager"})
    assert "did you mean" not in str(ei.value)
    assert "the fields are: attn_implementation, rms_norm_implementation" in str(ei.value)


# ----------------------------------------------------------------------------------------
# VeOmni fields for ops veomni-ops does not manage
# ----------------------------------------------------------------------------------------

QWEN3_5_YAML = """
model:
  ops_implementation:
    attn_implementation: flash_attention_2
    rms_norm_implementation: eager
    rms_norm_gated_implementation: fla
    causal_conv1d_implementation: fla
    chunk_gated_delta_rule_implementation: flash_qla
"""


def test_qwen3_5_fields_are_kept_as_unmanaged_with_a_warning(tmp_path):
    p = tmp_path / "qwen3_5.yaml"
    p.write_text(QWEN3_5_YAML)
    with pytest.warns(UnmanagedFieldWarning) as rec:
        cfg = OpsConfig.from_yaml(p)
    assert dict(cfg.unmanaged) == {"rms_norm_gated_implementation": "fla", "causal_conv1d_implementation": "fla",
                                   "chunk_gated_delta_rule_implementation": "flash_qla"}
    assert cfg.attn_implementation == "flash_attention_2" and cfg.rms_norm_implementation == "eager"
    (w,) = rec
    msg = str(w.message)
    assert "veomni-ops does not manage" in msg and "not applied" in msg
    for k in ("rms_norm_gated_implementation='fla'", "causal_conv1d_implementation='fla'",
              "chunk_gated_delta_rule_implementation='flash_qla'", "GatedDeltaNet"):
        assert k in msg
    assert w.filename == __file__  # the caller's line
    assert "unmanaged" not in cfg.to_dict() and len(cfg.to_dict()) == len(FIELD_TO_OP)
    hash(cfg)  # still a frozen, hashable value
    assert OpsConfig(unmanaged=dict(cfg.unmanaged)) == OpsConfig(unmanaged=cfg.unmanaged)


def test_unmanaged_fields_are_every_veomni_field_beyond_ours():
    assert {"rms_norm_gated_implementation", "causal_conv1d_implementation",
            "chunk_gated_delta_rule_implementation"} <= set(UNMANAGED_FIELDS)
    assert not set(UNMANAGED_FIELDS) & set(OpsConfig().to_dict())


def test_unmanaged_bad_values_join_the_other_problems():
    with pytest.raises(ConfigError) as ei:
        OpsConfig.from_dict({"causal_conv1d_implementation": 3, "bogus_field": "x"})
    assert len(ei.value.problems) == 2
    assert "causal_conv1d_implementation must be a string" in str(ei.value)
    with pytest.raises(ConfigError, match="not a field veomni-ops knows as unmanaged"):
        OpsConfig(unmanaged={"rms_norm_implementation": "liger"})


def test_no_unmanaged_warning_without_unmanaged_fields():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert OpsConfig.from_dict({"rms_norm_implementation": "eager"}).unmanaged == ()
        assert OpsConfig.from_dict({"causal_conv1d_implementation": None}).unmanaged == ()  # VeOmni's default


# ----------------------------------------------------------------------------------------
# legacy values
# ----------------------------------------------------------------------------------------


def _legacy_warnings(fn):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fn()
    return [w for w in rec if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("how", ["init", "from_dict", "from_yaml", "resolve"])
def test_legacy_warning_points_at_the_callers_line(tmp_path, how):
    p = tmp_path / "legacy.yaml"
    p.write_text("rms_norm_implementation: liger_kernel\n")
    calls = {
        "init": lambda: OpsConfig(rms_norm_implementation="liger_kernel"),
        "from_dict": lambda: OpsConfig.from_dict({"rms_norm_implementation": "liger_kernel"}),
        "from_yaml": lambda: OpsConfig.from_yaml(p),
        "resolve": lambda: resolve(str(p), "cpu", needs={}),
    }
    (w,) = _legacy_warnings(calls[how])
    assert issubclass(w.category, LegacyValueWarning)
    assert "write rms_norm_implementation: liger" in str(w.message)
    assert w.filename == __file__, f"attributed to {w.filename}:{w.lineno}, not to the caller"


def test_qualified_legacy_names_map_too():
    with pytest.warns(DeprecationWarning, match="write rms_norm_implementation: liger@veomni-liger"):
        cfg = OpsConfig(rms_norm_implementation="liger_kernel@veomni-liger")
    assert cfg.rms_norm_implementation == "liger@veomni-liger"
    with pytest.warns(DeprecationWarning, match="write moe_implementation: triton@veomni-triton"):
        assert OpsConfig(moe_implementation="Fused_Triton@Veomni_Triton").moe_implementation == "triton@veomni-triton"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert OpsConfig(rms_norm_implementation="liger@veomni-liger").rms_norm_implementation == "liger@veomni-liger"


@pytest.mark.parametrize("value,new", [("fused_quack", "quack"), ("fused_quack@veomni-quack", "quack@veomni-quack")])
def test_fused_quack_maps_to_veomni_quacks_moe_kernel(value, new):
    with pytest.warns(DeprecationWarning, match=f"write moe_implementation: {new}"):
        assert OpsConfig(moe_implementation=value).moe_implementation == new


def test_missing_yaml_is_named(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"{missing}: no such file"):
        OpsConfig.from_yaml(missing)


def test_yaml_problems_name_the_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("rms_norm_implementation: 3\nfoo_implementation: x\n")
    with pytest.raises(ConfigError) as ei:
        OpsConfig.from_yaml(p)
    assert str(ei.value).startswith(f"{p}: 2 problems in ops_implementation:")
    assert len(ei.value.problems) == 2


def test_a_single_yaml_problem_names_the_file_after_it(tmp_path):
    p = tmp_path / "typo.yaml"
    p.write_text("rms_norm_implmentation: eager\n")
    with pytest.raises(ConfigError) as ei:
        OpsConfig.from_yaml(p)
    assert str(ei.value) == ("unknown ops_implementation field 'rms_norm_implmentation'; did you mean "
                             f"'rms_norm_implementation'? (in {p})")


# ----------------------------------------------------------------------------------------
# every mistake in one run: the config's own problems with the refusals of its other fields;
# keys given twice; misspelt sections
# ----------------------------------------------------------------------------------------

TYPO_AND_UNRESOLVABLE = """\
model:
  ops_implementation:
    rms_norm_implmentation: eager
    swiglu_mlp_implementation: no_such_kernel
    cross_entropy_loss_implementation: eager
"""


def test_a_typo_and_an_unresolvable_kernel_are_one_error(tmp_path):
    """The config stage does not hide the resolution stage: the typo'd field and the kernel no
    plugin registers come in one ConfigError (its fields that are fine are resolved)."""
    p = tmp_path / "two.yaml"
    p.write_text(TYPO_AND_UNRESOLVABLE)
    for config in (p, str(p)):
        with pytest.raises(ConfigError) as ei:
            resolve(config, "cpu")
        e = ei.value
        assert str(e).startswith(f"{p}: 2 problems in ops_implementation (1 of them resolving its other fields for "
                                 "device cpu):\n  - unknown ops_implementation field 'rms_norm_implmentation'; did you "
                                 "mean 'rms_norm_implementation'?\n  - swiglu_mlp_implementation='no_such_kernel' "
                                 "(op swiglu, variant standard): ")
        assert [r.op for r in e.refusals] == ["swiglu"] and len(e.problems) == 2
    with pytest.raises(ConfigError) as ei:  # a mapping: the same, without a file
        resolve({"rms_norm_implmentation": "eager", "swiglu_mlp_implementation": "no_such_kernel"}, "cpu")
    assert str(ei.value).startswith("2 problems in ops_implementation (1 of them resolving")
    # Only the typo: a ConfigError as before; only the refusal: a ResolutionError as before.
    with pytest.raises(ConfigError) as ei:
        resolve({"rms_norm_implmentation": "eager"}, "cpu")
    assert ei.value.refusals == () and "did you mean 'rms_norm_implementation'" in str(ei.value)
    from veomni_ops import ResolutionError

    with pytest.raises(ResolutionError):
        resolve({"swiglu_mlp_implementation": "no_such_kernel"}, "cpu")


def test_cli_resolve_reports_the_typo_and_the_refusal_in_one_run(tmp_path, capsys):
    import json

    from veomni_ops.cli import main

    p = tmp_path / "two.yaml"
    p.write_text(TYPO_AND_UNRESOLVABLE)
    assert main(["resolve", str(p), "--device", "cpu", "--json"]) == 1
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["kind"] == "ConfigError" and len(data["problems"]) == 2
    assert "rms_norm_implmentation" in data["problems"][0] and "no_such_kernel" in data["problems"][1]
    assert err.startswith(f"veomni-ops resolve: {p}: 2 problems in ops_implementation")


def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("model:\n  ops_implementation:\n    rms_norm_implementation: liger\n"
                 "    attn_implementation: sdpa\n    rms_norm_implementation: eager\n")
    with pytest.raises(ConfigError) as ei:
        OpsConfig.from_yaml(p)
    assert str(ei.value) == (f"{p}:5: key 'rms_norm_implementation' is given twice, on lines 3 and 5 (YAML would "
                             f"keep the second silently): keep one (in {p})")
    # YAML merge keys are not duplicates; a key repeated in another mapping is not either.
    q = tmp_path / "merge.yaml"
    q.write_text("base: &b {rms_norm_implementation: eager}\nops_implementation:\n  <<: *b\n"
                 "  rms_norm_implementation: eager\n  attn_implementation: sdpa\n")
    assert OpsConfig.from_yaml(q).rms_norm_implementation == "eager"


def test_a_key_given_twice_in_flow_style_is_refused_naming_its_line_and_columns(tmp_path):
    """{a: 1, a: 2} puts both keys on one line: still a key given twice (issue 32)."""
    p = tmp_path / "flow.yaml"
    p.write_text("ops_implementation: {rms_norm_implementation: liger, rms_norm_implementation: eager}\n")
    with pytest.raises(ConfigError) as ei:
        OpsConfig.from_yaml(p)
    assert str(ei.value) == (f"{p}:1: key 'rms_norm_implementation' is given twice, on line 1 (columns 22 and 54) "
                             f"(YAML would keep the second silently): keep one (in {p})")
    q = tmp_path / "flow-lines.yaml"  # a flow mapping over several lines names both lines, as block style does
    q.write_text("ops_implementation: {rms_norm_implementation: liger,\n  rms_norm_implementation: eager}\n")
    with pytest.raises(ConfigError, match="on lines 1 and 2"):
        OpsConfig.from_yaml(q)


def test_a_file_that_is_not_utf8_is_named_with_the_byte_and_its_offset(tmp_path):
    p = tmp_path / "latin1.yaml"
    p.write_bytes("ops_implementation:\n  rms_norm_implementation: eager  # café\n".encode("latin-1"))
    with pytest.raises(ConfigError) as ei:
        OpsConfig.from_yaml(p)
    assert str(ei.value) == (f"{p}: is not UTF-8 text: the byte 0xe9 at byte offset 59 (line 2) cannot be decoded "
                             "(invalid continuation byte); save the file as UTF-8")
    # UTF-8 with a byte-order mark, and UTF-16 with one, are YAML and read
    for text in ("\ufeffops_implementation: {rms_norm_implementation: eager}\n".encode(),
                 "ops_implementation: {rms_norm_implementation: eager}\n".encode("utf-16")):
        p.write_bytes(text)
        assert OpsConfig.from_yaml(p).rms_norm_implementation == "eager"


@pytest.mark.parametrize("text,words", [
    ("modle:\n  ops_implementation:\n    rms_norm_implementation: eager\n",
     "'modle': unknown section; did you mean 'model'?"),
    ("model:\n  model_path: x\n  ops_implementaton:\n    rms_norm_implementation: eager\n",
     "model.ops_implementaton: unknown section; did you mean model.ops_implementation?"),
    ("ops_implementaton:\n  rms_norm_implementation: eager\n",
     "'ops_implementaton': unknown section; did you mean 'ops_implementation'?"),
])
def test_a_misspelt_section_is_named_with_a_did_you_mean(tmp_path, text, words):
    p = tmp_path / "typo.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as ei:
        OpsConfig.from_yaml(p)
    assert str(ei.value) == f"{words} (in {p})"


def test_the_block_in_a_misspelt_section_is_still_checked(tmp_path):
    p = tmp_path / "typo.yaml"
    p.write_text("modle:\n  ops_implementation:\n    rms_norm_implmentation: eager\n")
    with pytest.raises(ConfigError) as ei:
        OpsConfig.from_yaml(p)
    assert len(ei.value.problems) == 2 and "did you mean 'rms_norm_implementation'" in str(ei.value)


def test_a_veomni_config_without_an_ops_block_is_all_defaults():
    cfg = OpsConfig.from_dict({"model": {"model_path": "x"}, "data": {"train_path": "y"}, "train": {"lr": 1e-5}})
    assert set(cfg.to_dict().values()) == {"auto"}
