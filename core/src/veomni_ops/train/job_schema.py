"""The shape of the job YAML of ``veomni-ops train`` (see :mod:`veomni_ops.train.job`): its sections
and fields, their defaults, presets and the names they take, and the helpers that word a field's
problem."""

from __future__ import annotations

import difflib
import os
from typing import Any

#: architecture -> (transformers config class, causal-LM class, extra config kwargs)
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {"output_router_logits": True}),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", {}),
}


#: size preset -> config kwargs. "small" keeps Qwen's real vocabulary, where the logits dominate memory.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2),
    "small": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=64,
                  moe_intermediate_size=384, num_experts=32, num_experts_per_tok=4),
}


TRAIN_DEFAULTS: dict[str, Any] = dict(batch_size=4, seq_len=128, steps=20, lr=1e-3, dtype="float32",
                                      device="auto", seed=0, threads="auto", compile=False,
                                      compile_backend="inductor", compile_mode="default", init_device="device",
                                      checkpoint_dir=None, checkpoint_every=0, resume=False,
                                      gradient_checkpointing=False)


#: torch.compile's modes that train.compile_mode takes (inductor's; ``default`` is torch.compile's own
#: default). ``reduce-overhead`` records each compiled layer's forward and backward as CUDA graphs.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


#: The train fields that are true or false (null, ``compile:`` with no value, is refused as every field's is).
TRAIN_BOOLEANS = ("compile", "gradient_checkpointing")


#: Where train.init_device builds the model: on train.device (``device``), or on the meta device
#: (``meta``: no memory; materialised after FSDP2 sharded it, then given the weights the normal
#: build has, see :func:`veomni_ops.train.model.reference_model`).
INIT_DEVICES = ("device", "meta")


#: What train.dtype may be (torch dtype names; the bytes of one element), and spellings people write for them.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


DTYPES = tuple(DTYPE_BYTES)


DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
                 "fp64": "float64", "double": "float64"}


#: torch device types train.device may name (with an index: cuda:1), besides auto.
TRAIN_DEVICES = ("cpu", "cuda", "mps", "xpu", "npu")


#: The job's sections, and the model section's fields.
SECTIONS = ("model", "train", "data", "parallel", "lock")


MODEL_FIELDS = ("architecture", "size", "config_file", "config", "ops_implementation")


def _unknown(section: dict[str, Any], known: tuple[str, ...], what: str, prefix: str) -> list[str]:
    """One problem per key of ``section`` not in ``known``, with a did-you-mean where one is close."""
    out = []
    for key in section:
        if key in known:
            continue
        guess = difflib.get_close_matches(str(key), known, n=1, cutoff=0.7)
        hint = f"did you mean {prefix}{guess[0]}?" if guess else f"known: {', '.join(known)}"
        out.append(f"unknown {what} {prefix}{key}; {hint}")
    return out


def _no_value(field: str, fix: str) -> str:
    """The problem of ``field:`` written with no value: YAML reads it as null, which a job field
    never means (a section, ``train:`` or ``model.config:``, with nothing under it is empty)."""
    return f"{field} has no value (YAML reads '{field.rpartition('.')[2]}:' with nothing after it as null): {fix}"


def _not_fields(name: str, value: Any, fields: Any) -> str:
    """The problem of a section or nested field ``name`` that is not the mapping of ``fields`` it must be."""
    return f"{name} must be a mapping of fields ({', '.join(fields)}), not {type(value).__name__} {value!r}"


def _section(data: dict[str, Any], name: str, problems: list[str], required: bool = False) -> dict[str, Any]:
    value = data.get(name)
    if value is None:
        typo = next((k for k in data if difflib.get_close_matches(str(k), [name], cutoff=0.7)), None)
        if required and typo is None:
            problems.append(f"no '{name}:' section: the job needs one (architecture and size, or config_file; "
                            "ops_implementation)")
        return {}
    if not isinstance(value, dict):
        problems.append(f"{name} must be a mapping of fields, not {type(value).__name__} {value!r}")
        return {}
    return value


#: How to install what ``veomni-ops train`` builds its models with (the ``models`` extra: transformers).
MODELS_INSTALL = 'pip install "veomni-ops[models]"'


def _job_path(path: str, value: str) -> str:
    """``value``, a path in the job file ``path``, made absolute (relative: to the file's folder)."""
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), os.path.expanduser(value)))
