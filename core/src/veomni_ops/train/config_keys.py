"""The keys a transformers config class takes, and the ones its model's code reads: what a job's
``model.config`` may set (:func:`config_keys`). Reads source text; imports nothing of the job's."""

from __future__ import annotations

import functools
import inspect
import re

#: What a config's construction code reads from its keyword arguments (``kwargs.pop("rope_theta")``),
#: and the methods it calls on itself or its parents (``self.convert_rope_params_to_dict(``).
_READS_KWARG = re.compile(r"kwargs\.(?:pop|get)\(\s*[\"'](\w+)[\"']")
_CALLS = re.compile(r"(?:self|super\(\))\.(\w+)\(")
#: What model code reads from a config beyond the class's fields: ``getattr(config, "head_dim", ...)``
#: (transformers 5.24's Qwen3MoeConfig declares no ``head_dim``, and its attention reads one given).
_READS_CONFIG = re.compile(r"getattr\(\s*(?:self\.)?(?:text_)?config\s*,\s*[\"'](\w+)[\"']")
#: transformers' modules shared by every model that read such keys (rotary and mask set-up).
_SHARED_MODELING = ("modeling_rope_utils", "modeling_utils", "masking_utils", "integrations.sdpa_attention")


def _read_by_model_code(cls: type) -> set[str]:
    """The keys the model code of config class ``cls`` (its ``modeling_*`` module, beside its
    ``configuration_*`` one, and transformers' shared modules) reads with ``getattr(config, ...)``."""
    import importlib.util

    module = cls.__module__
    names = [module.replace(".configuration_", ".modeling_")] if ".configuration_" in module else []
    names += [f"transformers.{m}" for m in _SHARED_MODELING]
    keys: set[str] = set()
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        with open(spec.origin, encoding="utf-8") as fh:
            keys |= set(_READS_CONFIG.findall(fh.read()))
    return keys


@functools.cache
def config_keys(cls: type) -> frozenset[str]:
    """Every key the transformers config class ``cls`` takes: its ``__init__``'s parameters (the
    dataclass fields of transformers 5), its ``attribute_map``, the attributes of a default
    instance (a private one by its public name), its settable properties, and the keyword
    arguments its construction code reads itself (the legacy names it converts: ``rope_theta``,
    ``rope_scaling``, ``torch_dtype``), and the keys its model code reads with ``getattr(config,
    "key", default)`` (``head_dim`` of a Qwen3-MoE on transformers 5.24). Anything else a config
    would store and no model read."""
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    keys = {n for n, p in inspect.signature(cls).parameters.items() if p.kind not in skip}
    keys |= set(getattr(cls, "attribute_map", None) or {})
    keys |= {k.lstrip("_") for k in vars(cls())}
    keys |= {name for klass in cls.__mro__ for name, attr in vars(klass).items()
             if isinstance(attr, property) and attr.fset is not None}
    todo, seen = ["__init__", "__post_init__"], set()
    while todo:  # the construction's methods, through every class that defines them
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for klass in cls.__mro__:
            fn = vars(klass).get(name)
            try:
                source = inspect.getsource(fn) if inspect.isfunction(fn) else ""
            except (OSError, TypeError):  # a generated __init__ (a dataclass's) has no source
                continue
            keys |= set(_READS_KWARG.findall(source))
            todo += _CALLS.findall(source)
    return frozenset(keys | _read_by_model_code(cls))
