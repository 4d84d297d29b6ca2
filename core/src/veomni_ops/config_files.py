"""Reading an ops config (see :mod:`veomni_ops.config`): a YAML file, every key given twice
named and a file that is not UTF-8 said with its byte, and the ops block in what it holds (a
plain block, ``ops_implementation:``, or a whole VeOmni config, misspelt sections named)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

from .config_values import SUGGEST_CUTOFF, ConfigError


def _ops_block(data: Any, problems: list[str]) -> tuple[Mapping[str, Any], str]:
    """The ops block of ``data`` (a plain block, ``{ops_implementation: ...}`` or a whole VeOmni
    config, ``{model: {ops_implementation: ...}}``) and where it is, for messages. A VeOmni
    config whose ``model:`` has no ops block is all defaults. A misspelt section (``modle:``,
    ``ops_implementaton:``) is a problem that names it, and the block in it is still checked."""
    where = "ops_implementation"
    if data is None:
        return {}, where
    if not isinstance(data, Mapping):
        problems.append(f"ops_implementation must be a mapping of field: kernel name, got {type(data).__name__}")
        return {}, where
    block: Any = data
    whole = "model" in data and (data["model"] is None or isinstance(data["model"], Mapping))
    model_key = "model" if whole else _close_to(data, "model")
    if model_key is not None:  # a whole VeOmni config
        if model_key != "model":
            problems.append(f"{model_key!r}: unknown section; did you mean 'model'?")
        model = data[model_key] or {}  # an empty model: section is every default
        where = "model.ops_implementation"
        ops_key = "ops_implementation" if "ops_implementation" in model else _close_to(model, "ops_implementation")
        if ops_key is None:
            return {}, where  # VeOmni's model section without an ops block: every op auto
        if ops_key != "ops_implementation":
            problems.append(f"model.{ops_key}: unknown section; did you mean model.ops_implementation?")
        block = model[ops_key]
    else:
        ops_key = ("ops_implementation" if isinstance(data.get("ops_implementation"), Mapping)
                   else _close_to(data, "ops_implementation"))
        if ops_key is not None:
            if ops_key != "ops_implementation":
                problems.append(f"{ops_key!r}: unknown section; did you mean 'ops_implementation'?")
            block = data[ops_key]
    if block is None:
        return {}, where
    if not isinstance(block, Mapping):
        problems.append(f"{where} must be a mapping of field: kernel name, got {type(block).__name__}")
        return {}, where
    return block, where


def _close_to(mapping: Mapping[str, Any], name: str) -> str | None:
    """The key of ``mapping`` that is a misspelling of section ``name`` and holds a mapping, or None."""
    keys = [k for k, v in mapping.items() if isinstance(k, str) and isinstance(v, Mapping)]
    match = difflib.get_close_matches(name, keys, n=1, cutoff=SUGGEST_CUTOFF)
    return match[0] if match else None


def load_yaml(path: str | os.PathLike) -> tuple[Any, list[str]]:
    """The YAML document at ``path``, and its problems: each key given twice in one mapping, in
    block or flow style (YAML would keep the last value silently), named with both places. A
    file that is not YAML, or not UTF-8 text, raises :class:`ConfigError`; a missing one,
    ``FileNotFoundError``."""
    import yaml

    duplicates: list[str] = []

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            mark = key_node.start_mark
            try:
                first = seen.setdefault(key, mark)
            except TypeError:  # an unhashable key: PyYAML refuses it below
                continue
            if first is not mark:
                # Both on one line ({steps: 2, steps: 1}, flow style): the columns tell them apart.
                where = (f"on lines {first.line + 1} and {mark.line + 1}" if first.line != mark.line else
                         f"on line {mark.line + 1} (columns {first.column + 1} and {mark.column + 1})")
                duplicates.append(f"{os.fspath(path)}:{mark.line + 1}: key {key!r} is given twice, {where} (YAML "
                                  "would keep the second silently): keep one")
        return loader.construct_mapping(node, deep=True)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    # Bytes, not text: PyYAML then reads UTF-8 (or UTF-16 with its BOM) whatever the locale, and
    # a byte it cannot decode is a ReaderError with its offset, said below with the file's name.
    with open(path, "rb") as fh:
        try:
            data = yaml.load(fh, Loader=Loader)  # a SafeLoader: no arbitrary objects
        except yaml.reader.ReaderError as e:
            if e.encoding == "unicode":  # a character YAML does not allow (NUL, ...): PyYAML's words say it
                raise ConfigError(f"{os.fspath(path)}: not valid YAML: {e}") from None
            raise ConfigError(f"{os.fspath(path)}: {not_utf8(path, e.position, e.encoding, e.reason)}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{os.fspath(path)}: not valid YAML: {e}") from None
    return data, duplicates


def not_utf8(path: str | os.PathLike, offset: int, encoding: str = "utf-8", reason: str = "") -> str:
    """What to say of the file ``path`` whose byte at ``offset`` is not ``encoding`` text: the
    byte, its offset and line, and the fix."""
    with open(path, "rb") as fh:
        head = fh.read(offset + 1)
    byte = f" 0x{head[offset]:02x}" if offset < len(head) else ""
    why = f" ({reason})" if reason else ""
    line = head.count(b"\n") + 1
    return (f"is not {encoding.upper()} text: the byte{byte} at byte offset {offset} (line {line}) cannot be "
            f"decoded{why}; save the file as UTF-8")
