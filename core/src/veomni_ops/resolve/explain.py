"""Explaining: why a kernel is refused, and how to get what was asked.

A refusal (:class:`Refusal`) says what was asked, why not (its :class:`RefusalKind` and a
phrase), what is usable instead, and how to get what was asked: ``pip install
"veomni-ops[liger]"`` for our backends (``pip install -e plugins/veomni-liger`` where the core
runs from a source checkout that has the plugin), what the NPU kernels really need (torch-npu on
the Ascend CANN toolkit), or, for a kernel whose plugin ``VEOMNI_OPS_PLUGINS`` /
``VEOMNI_OPS_DISABLE`` switched off, that switch and its value. Every refusal of one config is
raised together as one :class:`ResolutionError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import OP_TO_FIELD
from ..device import DeviceInfo
from ..discovery import ENV_ALLOW, ENV_DENY
from ..plan import PlanEntry
from ..registry import (
    EXTRA_NOTES,
    FIRST_PARTY_DISTRIBUTIONS,
    PluginRecord,
    RegisteredKernel,
    Registry,
    extra_of,
    first_party_extra,
)
from ..spec import KernelSpec, canonical_distribution, split_name
from ..veomni import device_value, not_provided, off_device_fix

# The refusal types live in .refusal (which .checks imports too); ResolutionError keeps its old
# import path here.
from .refusal import Problem, Refusal, RefusalKind
from .refusal import ResolutionError as ResolutionError

if TYPE_CHECKING:
    from .checks import OpRequest


def _checkout_root() -> Path | None:
    """The root of the source checkout this core runs from (``core/src/veomni_ops`` inside
    it, as an editable install has it), or None for an installed wheel."""
    pkg = Path(__file__).resolve().parents[1]  # veomni_ops (this module is veomni_ops/resolve/explain.py)
    root = pkg.parents[2] if len(pkg.parents) > 2 else None
    if root is None or pkg.parent.name != "src" or not (pkg.parents[1] / "pyproject.toml").is_file():
        return None
    return root


def checkout_plugin_dir(distribution: str) -> str | None:
    """Where the plugin ``distribution`` lies in the source checkout the core runs from
    (``plugins/veomni-liger``: relative to the working directory when it is inside it), or None."""
    root = _checkout_root()
    if root is None:
        return None
    d = root / "plugins" / canonical_distribution(distribution)
    if not (d / "pyproject.toml").is_file():
        return None
    try:
        rel = os.path.relpath(d)
    except ValueError:  # another drive (Windows)
        return str(d)
    return str(d) if rel.startswith("..") else rel


def _first_party(kernel: str, distribution: str | None) -> tuple[str | None, str | None]:
    """(core extra, distribution) for a hint: the distribution given (its extra where the core
    has one), else the first-party plugin the bare kernel name belongs to, else (None, None)."""
    if distribution is not None:
        dist = canonical_distribution(distribution)
        return extra_of(dist), dist
    ours = first_party_extra(kernel)
    return ours if ours is not None else (None, None)


def install_hint(name: str, spec: KernelSpec | None = None, distribution: str | None = None) -> str:
    """How to get kernel ``name`` (bare or qualified): the hint its spec declares where it has
    one (its plugin is installed, a requirement is not), else the plugin to install: for our
    own backends the core's extra (read from the core's metadata), from a source checkout the
    editable install of the plugin beside the core."""
    kernel, qualifier = split_name(name)
    extra, dist = _first_party(kernel, distribution or qualifier)
    local = checkout_plugin_dir(dist) if dist in FIRST_PARTY_DISTRIBUTIONS else None
    if spec is not None and spec.install_hint:
        text = spec.install_hint
        index = f'pip install "veomni-ops[{extra}]"' if extra else None
        if local and index and index in text:
            text = text.replace(index, f"pip install -e {local} (from this source checkout; from the index: {index})", 1)
        elif local:
            text += f" (from this source checkout: pip install -e {local})"
        return f"To get it: {text}."
    if extra:
        if local:
            text = (f"pip install -e {local} (this veomni-ops runs from a source checkout; from the index: "
                    f'pip install "veomni-ops[{extra}]")')
        else:
            text = f'pip install "veomni-ops[{extra}]"'
        if extra in EXTRA_NOTES:
            text += f"; {EXTRA_NOTES[extra]}"
        return f"To get it: {text}."
    if dist:
        return (f"To get it: pip install {dist} (the distribution the name is qualified with), or choose a kernel "
                "listed above.")
    return (
        "To get it: install the distribution that provides it (it declares an entry point in the group "
        "'veomni_ops.backends'), or choose a kernel listed above."
    )


def as_veomni_means(got: PlanEntry | Refusal, op: str, written: str, dev: DeviceInfo) -> PlanEntry | Refusal:
    """What VeOmni's value ``written`` means on ``dev``, said in the plan entry (the kernel it
    stood for there) or in the refusal (what VeOmni's kernel is, and what to write instead)."""
    _, note = device_value(op, written, dev.type)
    if isinstance(got, PlanEntry):
        return dataclasses.replace(got, requested=written, reason=f"requested as {written!r}, {note}") if note else got
    if note:
        fix = off_device_fix(op, written, OP_TO_FIELD[op], dev.type)
        got = dataclasses.replace(got, requested=written, why=f"{got.why}; {note}", how=fix or got.how)
    veomni = not_provided(op, split_name(got.requested)[0], dev.type)
    if veomni is not None:
        got = dataclasses.replace(got, why=f"{got.why}. {veomni.describe()[:-1]}",
                                  how="" if got.kind is RefusalKind.UNKNOWN_NAME else got.how)
    return got


def _switch_hint(rec: PluginRecord) -> str:
    """How to switch a plugin back on, from the reason discovery recorded for it (which names
    the variable and its value)."""
    p = rec.provenance
    if ENV_DENY in rec.reason:
        return f"To use it, take {p.entry_point} / {p.distribution} out of {ENV_DENY}, or unset it."
    return f"To use it, add {p.distribution} to {ENV_ALLOW}, or unset it."


def refuse_contested(reg: Registry, req: OpRequest, name: str) -> Refusal:
    """The bare ``name`` is registered for the op by two distributions: say by which, and how to
    write either qualified."""
    provs = reg.distributions_of(req.op, name)
    field = OP_TO_FIELD[req.op]
    why = (f"kernel name {name!r} is registered for {req.op} by {len(provs)} distributions, "
           + " and ".join(str(p) for p in provs)
           + ", so the bare name selects neither (an installed package never takes a name from another silently)")
    how = ("Write the name qualified by its distribution: "
           + " or ".join(f"{field}: {name}@{p.qualifier}" for p in provs)
           + f". Or take one of them out: uninstall it, or {ENV_DENY}=<its distribution> ("
           + " / ".join(p.distribution for p in provs) + ").")
    return req.refuse(reg, RefusalKind.CONTESTED_NAME, why, how)


def refuse_unknown(reg: Registry, req: OpRequest) -> Refusal:
    """Nothing registered answers to the name for this op and its variants: say why, as
    precisely as the registry can (another variant, another distribution, a plugin switched off
    or failed), else suggest a close name and how to install it."""
    op, name = req.op, req.name
    kernel, dist = split_name(name)
    anywhere = [k.spec.variant for k in reg.for_op(op)
                if k.spec.name == kernel and (dist is None or k.provenance.qualifier == dist)]
    if anywhere:
        why = (f"kernel {name!r} provides variant(s) {', '.join(anywhere)} of {op}, but this needs "
               f"{' or '.join(req.variants)}")
        return req.refuse(reg, RefusalKind.WRONG_VARIANT, why, f"Choose a kernel that provides {req.variants[0]}, "
                                                                "or 'auto'.")
    others = reg.distributions_of(op, kernel) if dist is not None else []
    if others:
        why = (f"distribution {dist!r} registers no kernel {kernel!r} for {op}; "
               + " and ".join(str(p) for p in others) + f" register{'s' if len(others) == 1 else ''} it")
        refs = [kernel] if len(others) == 1 else [f"{kernel}@{p.qualifier}" for p in others]
        return req.refuse(reg, RefusalKind.WRONG_DISTRIBUTION, why,
                          "Write " + " or ".join(f"{OP_TO_FIELD[op]}: {r}" for r in refs) + ".")
    off = reg.switched_off_for(name)
    if off:
        why = (f"no kernel {name!r} is registered for {op}: the plugin that provides it, {off[0].provenance}, is "
               f"not loaded: {off[0].reason}")
        return req.refuse(reg, RefusalKind.SWITCHED_OFF, why, _switch_hint(off[0]))
    failures = reg.failures_for(name)
    if failures:
        why = f"no kernel {name!r} is registered for {op}; its plugin failed to load: " + "; ".join(
            f.describe() for f in failures
        )
        return req.refuse(reg, RefusalKind.PLUGIN_FAILED, why,
                          "Fix or reinstall the failing plugin (see the chained exception).", failures[0].error)
    guess = difflib.get_close_matches(kernel, reg.names(op), n=1)
    why = f"no kernel {name!r} is registered for {op}" + (f" (did you mean {guess[0]!r}?)" if guess else "")
    if reg.failures:
        # Not obviously theirs, but a failed plugin may be the one that provides it.
        why += "; note that these plugins failed to load: " + ", ".join(str(f.provenance) for f in reg.failures)
    switched = [p for p in reg.plugins if p.status == "disabled"]
    if switched:
        why += "; note that these plugins are not loaded: " + ", ".join(
            f"{p.provenance} ({p.reason})" for p in switched
        )
    cause = reg.failures[0].error if len(reg.failures) == 1 else None
    return req.refuse(reg, RefusalKind.UNKNOWN_NAME, why, install_hint(name), cause)


#: The fix-it hint of a named kernel refused for one of these kinds ("{device}": the device).
PICK_ANOTHER: Mapping[RefusalKind, str] = {
    RefusalKind.DEVICE: "Pick a kernel that runs on {device}, or 'auto'.",
    RefusalKind.FEATURE: "Pick a kernel listed above (they honour what the model needs), or 'auto'.",
    RefusalKind.COMPILE: "Pick a kernel listed above (they run under torch.compile), or 'auto', or do not compile.",
    RefusalKind.PARALLEL: "Pick a kernel listed above (they run under the layout), or 'auto', or set that parallel "
                          "degree to 1.",
}


def named_hint(problem: Problem, req: OpRequest, rk: RegisteredKernel) -> str:
    """The fix-it hint for a named kernel that is registered but refused, by the kind of refusal."""
    if problem.kind is RefusalKind.REQUIREMENT:
        return install_hint(req.name, rk.spec, rk.provenance.distribution)
    return PICK_ANOTHER.get(problem.kind, "").format(device=req.device)

