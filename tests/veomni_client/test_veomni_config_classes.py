"""VeOmni's own config class (``OpsImplementationConfig`` of the installed ``veomni``) against
veomni-ops' reading of the same values: VeOmni's defaults are ours under ``defaults="veomni"``,
every field it has is known here, and for VeOmni's config files (core/tests/fixtures/veomni),
read with ``defaults="veomni"``, each value means, off an NPU and on one, the kernel VeOmni itself
resolves it to there (VeOmni's NPU detection is patched to say yes for the NPU side: its rewrite
is plain Python).

Runs in the ``veomni`` nox session, beside test_veomni_models.py (VeOmni installed without its
dependencies; importing it patches transformers for the process).
"""

from __future__ import annotations

import dataclasses
import typing
import warnings
from pathlib import Path

import pytest

veomni = pytest.importorskip("veomni", reason="VeOmni is installed only in the `veomni` nox session")

import veomni.utils.import_utils as veomni_imports  # noqa: E402
import yaml  # noqa: E402
from veomni.arguments.arguments_types import OpsImplementationConfig  # noqa: E402
from veomni_ops import OpsConfig  # noqa: E402
from veomni_ops.config import FIELD_TO_OP, LEGACY_VALUES, UNMANAGED_FIELDS  # noqa: E402
from veomni_ops.spec import normalize_name  # noqa: E402
from veomni_ops.veomni import NOT_IN_VEOMNI, NOT_PROVIDED, VEOMNI_DEFAULTS  # noqa: E402

FIXTURES = Path(__file__).parents[2] / "core" / "tests" / "fixtures" / "veomni"
#: Attention kernels our distributions register (the core's, veomni-flash's).
#: Our fields VeOmni has too (not moe_router_implementation: VeOmni has no router field, NOT_IN_VEOMNI).
VEOMNI_FIELDS = {f: op for f, op in FIELD_TO_OP.items() if f not in NOT_IN_VEOMNI}
OUR_ATTENTION = {"eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4"}


def ours(op: str, veomni_value: str) -> str:
    """VeOmni's name of a kernel as it resolved it -> the name of that kernel here."""
    v = normalize_name(veomni_value)
    if v.startswith("veomni_") and v.endswith("_with_sp"):
        v = v.removeprefix("veomni_").removesuffix("_with_sp")
    if op == "moe_experts":
        v = v.removeprefix("fused_")
    if op == "cross_entropy" and v in ("chunk_loss", "npu"):  # VeOmni's 'npu' loss is its chunk_loss
        return "chunked"
    return "liger" if v == "liger_kernel" else v


def veomni_resolves(ops: dict, npu: bool, monkeypatch) -> dict[str, str] | str:
    """What VeOmni's config class makes of ``ops`` on a host with (or without) an NPU: the managed
    fields' values, or the error it raises."""
    real = veomni_imports.is_package_available
    monkeypatch.setattr(veomni_imports, "is_torch_npu_available", lambda: npu)
    # VeOmni checks that the triton package is there for its triton load-balancing loss (a CUDA host would have it)
    monkeypatch.setattr(veomni_imports, "is_package_available", lambda name: name == "triton" or real(name))
    try:
        cfg = OpsImplementationConfig(**ops)
    except ValueError as e:
        return str(e)
    return {f: getattr(cfg, f) for f in VEOMNI_FIELDS}


def ops_block(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    return dict((data["model"] or {}).get("ops_implementation") or {})


def test_veomnis_defaults_are_what_defaults_veomni_gives():
    defaults = {f.name: f.default for f in dataclasses.fields(OpsImplementationConfig)}
    assert {f: defaults[f] for f in VEOMNI_FIELDS} == {f: v for f, v in VEOMNI_DEFAULTS.items() if f in VEOMNI_FIELDS}
    assert OpsConfig.veomni_defaults().to_dict() == dict(VEOMNI_DEFAULTS)
    assert not set(NOT_IN_VEOMNI) & set(defaults)  # what NOT_IN_VEOMNI says: VeOmni has no such field


def test_every_veomni_field_is_known():
    fields = {f.name for f in dataclasses.fields(OpsImplementationConfig)}
    assert fields <= set(FIELD_TO_OP) | set(UNMANAGED_FIELDS), fields - set(FIELD_TO_OP) - set(UNMANAGED_FIELDS)


def test_every_attention_value_veomni_accepts_is_ours_mapped_or_refused_by_name():
    hint = typing.get_type_hints(OpsImplementationConfig)["attn_implementation"]
    values = {a for arg in typing.get_args(hint) for a in typing.get_args(arg)}
    assert "magi_attention" in values and "native-sparse" in values
    for v in values:
        name = normalize_name(v)
        assert name in OUR_ATTENTION or name in LEGACY_VALUES["attention"] or name in NOT_PROVIDED["attention"], v


@pytest.mark.parametrize("npu", [False, True], ids=["off-npu", "npu"])
@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.yaml")), ids=lambda p: p.stem)
def test_each_value_is_the_kernel_veomni_resolves_it_to(path, npu, monkeypatch):
    ops = ops_block(path)
    got = veomni_resolves(ops, npu, monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # VeOmni fills what a file omits with its defaults: defaults="veomni" reproduces that
        cfg = OpsConfig.from_dict(ops, defaults="veomni").for_device("npu" if npu else "cuda:9.0")
    if isinstance(got, str):
        # VeOmni refuses the file on this host: an NPU kernel off an NPU, a GPU-only kernel on one
        assert ("requires Ascend NPU" in got) != npu and ("not supported on Ascend NPU" in got) == npu, got
        return
    for field, op in VEOMNI_FIELDS.items():
        want = ours(op, got[field])
        if op == "attention" and npu and want.startswith("flash_attention_"):
            want = "npu"  # transformers' NPU flash attention there (npu_fusion_attention): veomni-npu's npu
        assert cfg.for_op(op) == want, (field, ops.get(field), got[field])


def test_which_files_veomni_refuses_where():
    refused = {}
    mp = pytest.MonkeyPatch()
    try:
        for path in sorted(FIXTURES.glob("*.yaml")):
            for npu in (False, True):
                if isinstance(veomni_resolves(ops_block(path), npu, mp), str):
                    refused.setdefault(path.stem, []).append("npu" if npu else "off-npu")
    finally:
        mp.undo()
    assert refused == {"text__deepseek_v4_npu": ["off-npu"],
                       "multimodal__qwen3_5_moe__qwen3_5_moe_vl_ascendc": ["off-npu"],
                       "text__gpt_oss_120b_lora_ep4": ["npu"]}
