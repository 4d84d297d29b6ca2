"""veomni_flash.transformers_adapter against the installed transformers (5.x), with the stand-ins."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AttentionInterface, Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from transformers.integrations import hub_kernels  # noqa: E402
from transformers.masking_utils import (  # noqa: E402
    ALL_MASK_ATTENTION_FUNCTIONS,
    AttentionMaskInterface,
    create_causal_mask,
    flash_attention_mask,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402
from veomni_flash import transformers_adapter as ta  # noqa: E402

pytestmark = pytest.mark.skipif(
    int(transformers.__version__.split(".")[0]) < 5, reason="the adapter targets transformers 5.x"
)


@pytest.fixture(autouse=True)
def clean():
    """Every test starts and ends with transformers' own registrations and loader."""
    ta.restore()
    yield
    ta.restore()
    import transformers.modeling_flash_attention_utils as mfu

    mfu._loaded_implementation = None  # transformers' preload cache is process-global


# ---- registration ---------------------------------------------------------------------------------


def _dummy(*a, **k):
    raise AssertionError("not called")


def test_register_attention_sets_function_and_flash_mask_and_restores():
    name = "veomni_test_attention"
    assert name not in AttentionInterface._global_mapping
    ta.register_attention(name, _dummy)
    assert ALL_ATTENTION_FUNCTIONS[name] is _dummy
    assert ALL_MASK_ATTENTION_FUNCTIONS[name] is flash_attention_mask
    ta.register_attention(name, _dummy)  # again: still one saved state
    ta.restore()
    assert name not in AttentionInterface._global_mapping
    assert name not in AttentionMaskInterface._global_mapping


def test_register_attention_rejects_bad_arguments():
    with pytest.raises(ValueError, match="non-empty string"):
        ta.register_attention("", _dummy)
    with pytest.raises(TypeError, match="callable"):
        ta.register_attention("x_attention", 3)


def test_overriding_a_builtin_name_is_restored():
    original = AttentionInterface._global_mapping["flash_attention_4"]
    ta.register_flash_attention(4)
    assert ALL_ATTENTION_FUNCTIONS["flash_attention_4"].__module__ == "veomni_flash.kernels.fa4"
    ta.restore()
    assert AttentionInterface._global_mapping["flash_attention_4"] is original


def _mask_config(name):
    cfg = Qwen3Config(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=4)
    cfg._attn_implementation = name
    return cfg


def test_unknown_name_gets_no_padding_mask_until_registered():
    """Why register_attention registers the mask too: transformers drops the mask for names it does not know."""
    name = "veomni_flash_attention_4_with_sp"
    emb = torch.zeros(2, 5, 8)
    pad = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    AttentionInterface.register(name, _dummy)  # function only, as plain AttentionInterface.register does
    try:
        assert create_causal_mask(config=_mask_config(name), inputs_embeds=emb, attention_mask=pad,
                                  past_key_values=None, position_ids=None) is None
    finally:
        AttentionInterface._global_mapping.pop(name)
    ta.register_flash_attention(4)
    got = create_causal_mask(config=_mask_config(name), inputs_embeds=emb, attention_mask=pad,
                             past_key_values=None, position_ids=None)
    assert got is not None and got.shape == (2, 5) and got.dtype == torch.bool
    assert got.tolist() == pad.bool().tolist()


def test_register_flash_attention_names_and_mismatch():
    names = ta.register_flash_attention(2)
    assert names == ["flash_attention_2", "veomni_flash_attention_2_with_sp"]
    for n in names:
        assert ALL_ATTENTION_FUNCTIONS[n].__name__ == "flash_attention_2"
    with pytest.raises(ValueError, match="names flash-attention 4, not 2"):
        ta.register_flash_attention(2, names=["flash_attention_4"])
    assert ta.register_flash_attention(3, names=["my_fa3"]) == ["my_fa3"]


# ---- the hub-kernel loader patch (seed 003) ---------------------------------------------------------


def test_lazy_imports_fails_for_veomni_names_without_patch():
    from transformers.modeling_flash_attention_utils import _lazy_imports

    with pytest.raises(ValueError, match="Could not find the currently requested flash attention"):
        _lazy_imports("veomni_flash_attention_4_with_sp")


@pytest.mark.parametrize("version", [2, 3, 4])
def test_lazy_imports_resolves_veomni_names_with_patch(version):
    import flash_reference
    from transformers.modeling_flash_attention_utils import _lazy_imports

    assert ta.patch_hub_kernel_loader() is True
    fn, varlen, kvcache, pad_fn, unpad_fn = _lazy_imports(f"veomni_flash_attention_{version}_with_sp")
    expect = {2: ("fa2_func", "fa2_varlen"), 3: ("fa3_func", "fa3_varlen"), 4: ("fa4_func", "fa4_varlen")}[version]
    assert fn is getattr(flash_reference, expect[0])
    assert varlen is getattr(flash_reference, expect[1])
    assert kvcache is None


def test_patch_is_idempotent_and_delegates_everything_else(monkeypatch):
    seen = []

    def fake_original(attn_implementation, attention_wrapper=None, allow_all_kernels=False):
        seen.append((attn_implementation, attention_wrapper, allow_all_kernels))
        return "hub-kernel"

    monkeypatch.setattr(hub_kernels, "load_and_register_attn_kernel", fake_original)
    assert ta.patch_hub_kernel_loader() and ta.patch_hub_kernel_loader()
    patched = hub_kernels.load_and_register_attn_kernel
    assert patched is not fake_original and getattr(patched, "__veomni_flash__", False)
    wrapper = object()
    assert patched("kernels-community/flash-attn4", wrapper, allow_all_kernels=True) == "hub-kernel"
    assert patched("paged|veomni_flash_attention_2_with_sp") == "hub-kernel"  # paged aliases: out of scope
    assert seen == [("kernels-community/flash-attn4", wrapper, True), ("paged|veomni_flash_attention_2_with_sp", None, False)]
    ns = patched("veomni_flash_attention_4_with_sp")
    assert callable(ns.flash_attn_func) and callable(ns.flash_attn_varlen_func)
    assert len(seen) == 2  # our names never reach the hub
    ta.restore()
    assert hub_kernels.load_and_register_attn_kernel is fake_original


def test_local_flash_kernel_rejects_unknown_names():
    with pytest.raises(KeyError, match="not a veomni-flash attention name"):
        ta.local_flash_kernel("flash_attention_5")


# ---- a tiny Qwen3 end to end ------------------------------------------------------------------------


def tiny_config(**kw):
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=128, attention_dropout=0.0)
    base.update(kw)
    return Qwen3Config(**base)


def build(cfg, impl):
    torch.manual_seed(0)
    # A copy per model: the model keeps (and mutates) the config it is given.
    return Qwen3ForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.bfloat16).eval()


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def compare_with_eager(impl, calls, cfg=None, *, ids, **inputs):
    cfg = cfg or tiny_config()
    ours = build(cfg, impl)
    eager = build(cfg, "eager")
    eager.load_state_dict(ours.state_dict())
    with torch.no_grad():
        got = ours(input_ids=ids, **inputs).logits
        ref = eager(input_ids=ids, **inputs).logits
    used = {c["api"] for c in calls}
    assert used, "the flash adapter was never called"
    return got, ref, used


@pytest.mark.parametrize("impl", ["veomni_flash_attention_4_with_sp", "flash_attention_4"])
def test_tiny_qwen3_with_fa4_padding(impl, calls, monkeypatch):
    if impl == "flash_attention_4":
        # transformers checks FA4's distribution and a CUDA device before accepting the bare name; on
        # this CPU box with a stand-in both checks fail, so make them report what a GPU box would.
        import transformers.modeling_utils as mu

        monkeypatch.setitem(mu.FLASH_ATTENTION_COMPATIBILITY_MATRIX[4], "general_availability_check", lambda: True)
    ta.register_flash_attention(4)
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    am = torch.ones(3, 11, dtype=torch.long)
    am[0, :4] = 0  # left padding
    am[1, 8:] = 0  # right padding
    got, ref, used = compare_with_eager(impl, calls, ids=ids, attention_mask=am)
    assert used == {"fa4.varlen"}
    valid = am.bool()
    assert rel_err(got[valid], ref[valid]) < 3e-2


def test_tiny_qwen3_fa4_packed_position_ids(calls):
    ta.register_flash_attention(4)
    lengths = [6, 3, 8]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    ids = torch.randint(0, 97, (1, sum(lengths)), generator=torch.Generator().manual_seed(2))
    # use_cache=False: transformers' eager mask honours packing only without a cache (a training setup).
    got, ref, used = compare_with_eager("veomni_flash_attention_4_with_sp", calls, ids=ids, position_ids=pos,
                                        use_cache=False)
    assert used == {"fa4.varlen"}
    assert rel_err(got, ref) < 3e-2
    # And it really is per document: the same tokens unpacked give a different answer.
    with torch.no_grad():
        unpacked = build(tiny_config(), "veomni_flash_attention_4_with_sp")(input_ids=ids, use_cache=False).logits
    assert rel_err(unpacked, got) > 5e-2


@pytest.mark.parametrize("version", [2, 3])
def test_tiny_qwen3_sliding_window_fa2_fa3(version, calls):
    ta.register_flash_attention(version)
    cfg = tiny_config(layer_types=["sliding_attention", "full_attention"], sliding_window=4, use_sliding_window=True,
                      max_window_layers=2)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(3))
    am = torch.ones(2, 12, dtype=torch.long)
    am[0, :3] = 0
    got, ref, used = compare_with_eager(f"veomni_flash_attention_{version}_with_sp", calls, cfg, ids=ids,
                                        attention_mask=am)
    assert any(c.get("window_size") is not None and tuple(c["window_size"]) == (3, 0) for c in calls)
    valid = am.bool()
    assert rel_err(got[valid], ref[valid]) < 3e-2


def test_tiny_qwen3_training_dropout_refused_for_fa4(calls):
    ta.register_flash_attention(4)
    m = build(tiny_config(attention_dropout=0.1), "veomni_flash_attention_4_with_sp").train()
    with pytest.raises(ValueError, match="no attention dropout"):
        m(input_ids=torch.randint(0, 97, (1, 5)))
