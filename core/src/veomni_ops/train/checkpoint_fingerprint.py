"""What a checkpoint records of the model and the plan that wrote it (see
:mod:`veomni_ops.train.checkpoint`): every field of the model's transformers config, but those a
resumed run may change, the fields that differ between two, and the kernel bound for each op."""

from __future__ import annotations

import json
from typing import Any

#: Fields of the model's transformers config that a resumed run may change, with why: none
#: changes what the model computes from the weights it loads. Every other field is compared.
CONFIG_FIELDS_IGNORED = {
    "transformers_version": "the versions are recorded apart",
    "_name_or_path": "a label", "architectures": "a label",
    "dtype": "train.dtype decides it (a resume in another dtype is said)",
    "torch_dtype": "train.dtype decides it (a resume in another dtype is said)",
    "attn_implementation": "the plan binds attention (its kernel is compared with the plan)",
    "_attn_implementation": "the plan binds attention (its kernel is compared with the plan)",
    "use_cache": "the KV cache of generation; training has none",
    "return_dict": "the form of the outputs", "output_attentions": "the form of the outputs",
    "output_hidden_states": "the form of the outputs",
    "id2label": "the labels of classification heads", "label2id": "the labels of classification heads",
    "problem_type": "the loss of classification heads",
    "initializer_range": "the initial weights only: a resumed run loads its weights",
}


def config_fingerprint(config) -> dict[str, Any]:
    """Every field of the model's transformers ``config`` (as the job built it: the preset or
    file, then the overrides) as JSON, but those of :data:`CONFIG_FIELDS_IGNORED`."""
    fields = json.loads(config.to_json_string(use_diff=False))
    return {k: v for k, v in fields.items() if k not in CONFIG_FIELDS_IGNORED}


def config_differences(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """Each field that differs between two :func:`config_fingerprint` s, ``field: old -> new``
    (a nested field by its dotted name, ``rope_parameters.rope_theta``); none where ``old`` is
    None (a checkpoint of an earlier veomni-ops, which recorded none)."""
    if old is None:
        return []
    a, b = _flat(old), _flat(json.loads(json.dumps(new)))
    absent = object()
    out = []
    for key in sorted({*a, *b}):
        x, y = a.get(key, absent), b.get(key, absent)
        if x != y:
            out.append(f"{key}: {'(absent)' if x is absent else json.dumps(x)} -> "
                       f"{'(absent)' if y is absent else json.dumps(y)}")
    return out


def _flat(fields: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in fields.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def plan_fingerprint(binding) -> dict[str, str]:
    """The kernel bound for each op and variant of a bound model, ``{"rms_norm/standard": "liger
    (veomni-liger)"}``: what ``binding`` (``veomni_ops.apply``'s) bound, at one place or more."""
    out = {}
    for _, op, variant, kernel in binding.bound:
        entry = binding.plan.get(op, variant)
        out[f"{op}/{variant}"] = kernel + (f" ({entry.distribution})" if entry is not None else "")
    return dict(sorted(out.items()))
