"""Tiny transformers models (random weights, no downloads) and the helpers the model tests share.

Every model has hidden size 64, 2 layers, 4 attention heads, 2 key/value heads (4 for
DeepSeek-V3, whose MLA expands the latent to every head), vocabulary 128 and, for MoE
models, 4 experts with top-2 routing. Dropout is off so that patched and unpatched models
can be compared in training mode.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable

import torch
import transformers as T
from torch import nn

VOCAB = 128
COMMON = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=64,
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
# Qwen3.5 / Qwen3-Next: one gated-delta-net (linear attention) layer, one full attention layer.
HYBRID = dict(
    head_dim=16,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    layer_types=["linear_attention", "full_attention"],
)

ALL_FIELDS = (
    "attn_implementation",
    "rms_norm_implementation",
    "rotary_pos_emb_implementation",
    "swiglu_mlp_implementation",
    "cross_entropy_loss_implementation",
    "moe_implementation",
    "load_balancing_loss_implementation",
    "moe_router_implementation",
    "residual_rms_norm_implementation",
)
ALL_EAGER = {f: "eager" for f in ALL_FIELDS}


def _cfg(name: str, **over):
    if name == "llama":
        return T.LlamaConfig(**{**COMMON, **over})
    if name == "qwen2":
        return T.Qwen2Config(**{**COMMON, **over})
    if name == "qwen3":
        return T.Qwen3Config(**{**COMMON, "head_dim": 16, **over})
    if name == "qwen3_moe":
        return T.Qwen3MoeConfig(**{**COMMON, "head_dim": 16, **MOE, "decoder_sparse_step": 1, **over})
    if name == "deepseek_v3":
        return T.DeepseekV3Config(**{
            **COMMON, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
            "n_shared_experts": 1, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16, "v_head_dim": 16, **over})
    if name == "seed_oss":
        return T.SeedOssConfig(**{**COMMON, "head_dim": 16, "attention_dropout": 0.0, "residual_dropout": 0.0, **over})
    if name == "qwen2_vl":
        text = dict(COMMON, rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]))
        vision = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, in_channels=3, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2)
        return T.Qwen2VLConfig(text_config=text, vision_config=vision, vocab_size=VOCAB, image_token_id=120,
                               video_token_id=121, vision_start_token_id=122, vision_end_token_id=123, **over)
    if name == "qwen3_5":
        return T.Qwen3_5TextConfig(**{**COMMON, **HYBRID, **over})
    if name == "qwen3_5_moe":
        return T.Qwen3_5MoeTextConfig(**{**COMMON, **HYBRID, **MOE, "shared_expert_intermediate_size": 32, **over})
    if name == "qwen3_next":
        return T.Qwen3NextConfig(**{**COMMON, **HYBRID, **MOE, "shared_expert_intermediate_size": 32, **over})
    # The rest of the family matrix (test_models_families.py).
    if name == "mistral":
        return T.MistralConfig(**{**COMMON, "head_dim": 16, "sliding_window": 8, **over})
    if name == "mixtral":
        return T.MixtralConfig(**{**COMMON, "num_local_experts": 4, "num_experts_per_tok": 2, **over})
    if name == "qwen2_moe":
        return T.Qwen2MoeConfig(**{**COMMON, **MOE, "shared_expert_intermediate_size": 32, "decoder_sparse_step": 1,
                                   **over})
    if name == "qwen2_5_vl":
        text = dict(COMMON, rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]))
        vision = dict(depth=1, hidden_size=32, out_hidden_size=64, num_heads=2, in_channels=3, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, intermediate_size=64, fullatt_block_indexes=[0])
        return T.Qwen2_5_VLConfig(text_config=text, vision_config=vision, vocab_size=VOCAB, image_token_id=120,
                                  video_token_id=121, vision_start_token_id=122, vision_end_token_id=123, **over)
    if name == "gemma":
        return T.GemmaConfig(**{**COMMON, "head_dim": 16, **over})
    if name == "gemma2":  # attention logit soft-capping (50) and final logit soft-capping (30): the defaults
        return T.Gemma2Config(**{**COMMON, "head_dim": 16, "sliding_window": 8, **over})
    if name == "gemma3":
        return T.Gemma3TextConfig(**{**COMMON, "head_dim": 16, "sliding_window": 8, **over})
    if name == "gpt_oss":  # attention sinks; experts with biases and a clamped activation
        return T.GptOssConfig(**{**COMMON, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                                 "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"], **over})
    if name == "granite":  # attention/residual/embedding multipliers, logits_scaling
        return T.GraniteConfig(**{**COMMON, **over})
    raise KeyError(name)


CLASSES: dict[str, Callable[[], type]] = {
    "llama": lambda: T.LlamaForCausalLM,
    "qwen2": lambda: T.Qwen2ForCausalLM,
    "qwen3": lambda: T.Qwen3ForCausalLM,
    "qwen3_moe": lambda: T.Qwen3MoeForCausalLM,
    "deepseek_v3": lambda: T.DeepseekV3ForCausalLM,
    "seed_oss": lambda: T.SeedOssForCausalLM,
    "qwen2_vl": lambda: T.Qwen2VLForConditionalGeneration,
    "qwen3_5": lambda: T.Qwen3_5ForCausalLM,
    "qwen3_5_moe": lambda: T.Qwen3_5MoeForCausalLM,
    "qwen3_next": lambda: T.Qwen3NextForCausalLM,
}
MODELS = tuple(CLASSES)
#: The rest of the families binding supports: each test of the family matrix runs on every one.
MORE_CLASSES: dict[str, Callable[[], type]] = {
    "mistral": lambda: T.MistralForCausalLM,
    "mixtral": lambda: T.MixtralForCausalLM,
    "qwen2_moe": lambda: T.Qwen2MoeForCausalLM,
    "qwen2_5_vl": lambda: T.Qwen2_5_VLForConditionalGeneration,
    "gemma": lambda: T.GemmaForCausalLM,
    "gemma2": lambda: T.Gemma2ForCausalLM,
    "gemma3": lambda: T.Gemma3ForCausalLM,
    "gpt_oss": lambda: T.GptOssForCausalLM,
    "granite": lambda: T.GraniteForCausalLM,
}
CLASSES.update(MORE_CLASSES)
FAMILIES = MODELS + tuple(MORE_CLASSES)
#: Models with routed experts, and those whose causal-LM head computes the aux loss.
MOE_MODELS = ("qwen3_moe", "deepseek_v3", "qwen3_5_moe", "qwen3_next")
AUX_LOSS_MODELS = ("qwen3_moe", "qwen3_5_moe", "qwen3_next")
#: Families whose causal-LM head computes the MoE aux loss when asked (output_router_logits).
AUX_LOSS_FAMILIES = AUX_LOSS_MODELS + ("mixtral", "qwen2_moe", "gpt_oss")
#: Offset RMSNorm x̂(1+w) and partial rotary.
OFFSET_MODELS = ("qwen3_5", "qwen3_5_moe", "qwen3_next")


def config(name: str, **over):
    return _cfg(name, **over)


def build(name: str, dtype: torch.dtype = torch.float32, seed: int = 0, cfg=None, **over) -> nn.Module:
    """A tiny ``name`` model with random weights (seeded), in training mode."""
    cfg = cfg if cfg is not None else _cfg(name, **over)
    torch.manual_seed(seed)
    try:
        cls = CLASSES[name]()
    except AttributeError as e:  # a family this transformers release does not have
        import pytest

        pytest.skip(f"transformers {T.__version__} has no {name}: {e}")
    model = cls(cfg).to(dtype)
    if name in OFFSET_MODELS:
        # transformers initialises the offset norms' weights to zero (1 + w = 1), which would
        # make x̂*(1+w) and w*x̂ indistinguishable in gradients; give them random values.
        with torch.no_grad():
            for m in model.modules():
                if type(m).__name__.endswith("RMSNorm") and isinstance(getattr(m, "weight", None), torch.Tensor):
                    m.weight.normal_(0.0, 0.2)
    return model.train()


def pair(name: str, dtype: torch.dtype = torch.float32, **over) -> tuple[nn.Module, nn.Module]:
    """(reference, copy to patch): the same weights, the copy made before any apply."""
    ref = build(name, dtype, **over)
    return ref, copy.deepcopy(ref)


def batch(seed: int = 1, b: int = 2, s: int = 12) -> dict[str, torch.Tensor]:
    """input_ids, labels with ignore_index at the start of row 0 and a padded attention mask on row 1."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 100, (b, s), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100
    mask = torch.ones(b, s, dtype=torch.long)
    if b > 1:
        mask[1, :2] = 0  # left padding
        # Padded positions attend to nothing, so their outputs are implementation-defined:
        # no label may be predicted from one (labels are shifted: position t predicts t + 1).
        labels[1, :3] = -100
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def named_grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()}


def assert_grads_close(ref: nn.Module, got: nn.Module, atol: float, rtol: float) -> int:
    """Every parameter: both have a gradient or neither, and they agree. Returns how many were compared."""
    gr, gg = named_grads(ref), named_grads(got)
    assert gr.keys() == gg.keys()
    compared = 0
    for n in gr:
        a, b = gr[n], gg[n]
        assert (a is None) == (b is None), f"{n}: gradient present in one model only ({a is None=}, {b is None=})"
        if a is None:
            continue
        torch.testing.assert_close(b, a, atol=atol, rtol=rtol, msg=lambda m, n=n: f"grad of {n}: {m}")
        compared += 1
    return compared


def zero_grads(models: Iterable[nn.Module]) -> None:
    for m in models:
        m.zero_grad(set_to_none=True)
