"""The ``veomni-ops`` command.

    veomni-ops plugins [--device D] [--json]         what is installed, loaded, usable here (or on D)
    veomni-ops resolve CONFIG [--device D] [--json]  the plan a config gives on a device
    veomni-ops train CONFIG [--compare OTHER] [--baseline NAME]...
                                                     the main job (see veomni_ops.train)
    veomni-ops check [--backend NAME] [--op OP]      every usable kernel against the reference
    veomni-ops bench [--op OP] [--preset NAME]       every usable kernel against eager, timed
    veomni-ops tune JOB [--out LOCK] [--dry-run]     time each op's candidates in the job's steps; write a plan lock
    veomni-ops new-backend NAME [DIR]                a new backend: the backend template, renamed for NAME

Exit codes: 0 ok; 1 the request was refused or a check failed (explanation on stderr; with
the ``--json`` flag also ``{"error": ..., "kind": ...}`` on stdout); 2 bad usage.

Planning for another device (``--device cuda:9.0`` on a laptop) imports no kernel, and a
kernel's ``requires`` cannot be checked there: this machine's installed packages say nothing
about the target's. Requirements this machine does not meet are reported as "not checked
here: requires X", not refused. Config warnings (legacy values, fields veomni-ops does not
manage) are printed on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from .reporting import ENV_TRACE, error_text

__all__ = ["ENV_TRACE", "EXTERNAL_COMMANDS", "build_parser", "error_text", "main"]

#: Subcommands that live in their own modules: name -> (module, help). Each module has
#: ``configure(parser)`` and ``run(args) -> int``; imported only when that command runs.
EXTERNAL_COMMANDS = {
    "train": ("veomni_ops.train", "train a model with a plan (the demo); see examples/"),
    "check": ("veomni_ops.testing.check", "check every usable kernel against the eager reference"),
    "bench": ("veomni_ops.bench", "benchmark every usable kernel against eager"),
    "tune": ("veomni_ops.tune", "time each op's candidate kernels inside a job's training steps; write a plan lock"),
    "new-backend": ("veomni_ops.new_backend", "write a new backend: the backend template, renamed for NAME"),
}

# ----------------------------------------------------------------------------------------
# Planning for another device
# ----------------------------------------------------------------------------------------


def _remote(dev) -> bool:
    from .device import is_local

    return not is_local(dev)


def _here() -> str:
    from .device import detected_device

    return str(detected_device())


# ----------------------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------------------


def _cmd_plugins(args: argparse.Namespace) -> int:
    from .device import current_device
    from .discovery import discover
    from .resolve import kernel_problem, unmet_requirements

    reg = discover()
    dev = current_device(args.device)
    remote = _remote(dev)
    kernels = []
    for rk in reg:
        # Checks and, on this machine's device, an import of its kernel: one that fails is not usable.
        # For another device: no import, and the target machine's requirements cannot be seen from here.
        why = kernel_problem(rk, dev, training=False, registry=reg)
        unchecked = unmet_requirements(rk.spec.requires) if remote else ()
        kernels.append({**rk.spec.to_dict(), "distribution": rk.provenance.distribution,
                        "version": rk.provenance.version, "usable": why is None, "why_not": why or "",
                        "not_checked": [f"requires {r}" for r in unchecked] if why is None else []})
    if args.json:
        out = {"device": dev.to_dict(), "planned_from": _here() if remote else None,
               "discovery_ms": round(reg.discovery_seconds * 1e3, 2),
               "plugins": [p.to_dict() for p in reg.plugins], "kernels": kernels}
        print(json.dumps(out, indent=2))
        return 0
    print(f"device: {dev}" + (f" ({dev.name})" if dev.name else ""))
    if remote:
        print(f"  judged from this {_here()} machine: kernels are not imported, and requirements this machine "
              "does not meet are not checked (\"not checked here\")")
    print(f"plugins (group veomni_ops.backends, discovered in {reg.discovery_seconds * 1e3:.1f} ms):")
    for p in reg.plugins:
        line = f"  {p.provenance.entry_point:<10} {p.provenance.distribution} {p.provenance.version}: {p.status}"
        if p.reason:
            line += f" - {p.reason}"
        if p.phase:
            line += f" (at {p.phase})"
        print(line)
    print("kernels:")
    rows = [("op", "variant", "kernel", "hardware", "from", f"usable there ({dev})" if remote else "usable here")]
    for k in kernels:
        hw = k["hardware"]
        hwtxt = "/".join(hw["device_types"])
        if hw["min_capability"] or hw["max_capability"]:
            lo = ".".join(map(str, hw["min_capability"] or [])) or ""
            hi = ".".join(map(str, hw["max_capability"] or [])) or ""
            hwtxt += f" sm{lo}..{hi}"
        if not k["usable"]:
            usable = f"no: {k['why_not']}"
        elif k["not_checked"]:
            usable = f"yes; not checked here: {', '.join(k['not_checked'])}"
        else:
            usable = "yes"
        rows.append((k["op"], k["variant"], k["name"], hwtxt, k["distribution"], usable))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r[:5], widths)) + "  " + r[5])
    return 0


def _cmd_resolve(args: argparse.Namespace) -> int:
    from .config import UNMANAGED_FIELDS, config_error, read_config_file
    from .device import current_device
    from .resolve import ResolutionError, resolve
    from .target import Mode, Target

    dev = current_device(args.device)
    # The file's own problems and the refusals of its other fields come in one error, with VeOmni's
    # defaults as with ours: the file is read once (its fields with problems left auto), the rest
    # resolved, and both reported together, as veomni_ops.resolve does for a file. For another
    # device than this machine's, no kernel is imported and the requirements that could not be
    # checked are listed (plan.not_checked, under its table): veomni_ops.resolve's code, as is.
    cfg, problems = read_config_file(args.config, defaults=args.defaults)
    try:
        plan = resolve(cfg, Target(dev, mode=Mode.of(training=not args.inference, compile=args.compile)),
                       lock=_lock_of(args))
    except ResolutionError as e:
        if not problems:
            raise
        raise config_error(problems, args.config, e.refusals, dev) from None
    if problems:
        raise config_error(problems, args.config, (), dev)
    unmanaged = dict(plan.config.unmanaged)
    if args.json:
        out: dict[str, Any] = plan.to_dict()
        out["unmanaged"] = unmanaged
        print(json.dumps(out, indent=2))
        return 0
    print(plan.table())
    if unmanaged:
        print("\nnot managed by veomni-ops (kept as given, not applied; the model's own code runs these ops):")
        width = max(map(len, unmanaged))
        for k, v in unmanaged.items():
            print(f"  {k.ljust(width)}  {v}  ({UNMANAGED_FIELDS[k]})")
    return 0


def _lock_of(args: argparse.Namespace) -> Any:
    """The plan lock of ``resolve``: ``--lock`` (explicit), else a job YAML's ``lock:`` key (found),
    else None (``VEOMNI_OPS_LOCK``, if set)."""
    from .lock import LockFile

    if args.lock:
        return LockFile(args.lock, explicit=True, origin="--lock")
    import yaml

    try:
        with open(args.config) as fh:
            data = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError):  # OpsConfig.from_yaml read it already; nothing more to find
        return None
    value = data.get("lock") if isinstance(data, dict) else None
    if not isinstance(value, str):
        return None
    from .train.job import job_lock

    return job_lock(args.config, value)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="veomni-ops", description="Kernel selection for LLM training.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("plugins", help="list installed backends and their kernels")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--device", help="judge usability for this device (e.g. cuda:9.0, npu, cpu)")
    p.set_defaults(func=_cmd_plugins)
    p = sub.add_parser("resolve", help="resolve a config (YAML) into a kernel plan")
    p.add_argument("config", help="YAML file with an ops_implementation block (or a VeOmni config)")
    p.add_argument("--device", help="resolve for this device instead of the local one (e.g. cuda:9.0)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--inference", action="store_true", help="accept kernels without a backward")
    p.add_argument("--compile", action="store_true", help="resolve for a model run under torch.compile")
    p.add_argument("--lock", metavar="LOCK.json", help="resolve auto with this plan lock (veomni-ops tune writes "
                                                       "one); an error where it does not match here. Without it: "
                                                       "the YAML's lock: key, else VEOMNI_OPS_LOCK")
    p.add_argument("--defaults", choices=("auto", "veomni"), default="auto",
                   help="what a field the config omits is: auto (default), or VeOmni's default for it, which then "
                        "means on each device what it means in VeOmni there")
    p.set_defaults(func=_cmd_resolve)
    for name, (module, help_text) in EXTERNAL_COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(module=module)
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if not e.name or not (module == e.name or module.startswith(e.name + ".")):
                raise
            p.set_defaults(func=lambda a, n=name: _unavailable(n))
            continue
        mod.configure(p)
        p.set_defaults(func=mod.run)
    return ap


def _unavailable(name: str) -> int:
    print(f"veomni-ops {name}: this installation has no '{name}' command", file=sys.stderr)
    return 2


# ----------------------------------------------------------------------------------------
# Errors and warnings
# ----------------------------------------------------------------------------------------


def _problems(e: BaseException) -> list[str] | None:
    problems = getattr(e, "problems", None)  # a ConfigError's (the refusals of its other fields end it)
    if problems and len(problems) > 1:
        return list(problems)
    refusals = getattr(e, "refusals", None)
    return [r.describe() for r in refusals] if refusals else None


def _report(args: argparse.Namespace, e: BaseException, message: str) -> None:
    """The error on stderr; with ``--json`` (the flag of plugins, resolve, train and check;
    bench's ``--json FILE`` names a file) also as JSON on stdout, where the output was due. Under
    torchrun only rank 0 writes the JSON, as only rank 0 writes a result: the ranks share stdout,
    and one JSON document is what a reader of ``--json`` parses."""
    if getattr(args, "json", None) is True and os.environ.get("RANK", "0") == "0":
        out: dict[str, Any] = {"error": message, "kind": type(e).__name__, "command": args.command}
        problems = _problems(e)
        if problems:
            out["problems"] = problems
        print(json.dumps(out, indent=2))
    print(f"veomni-ops {args.command}: {message}", file=sys.stderr)


@contextlib.contextmanager
def _config_warnings(command: str, show: bool) -> Iterator[None]:
    """Config warnings (legacy values, unmanaged fields) reach the user: one line each on
    stderr, whatever Python's default filters say about DeprecationWarning."""
    from .config import LegacyValueWarning, UnmanagedFieldWarning
    from .lock import LockWarning

    ours = (LegacyValueWarning, UnmanagedFieldWarning, LockWarning)
    with warnings.catch_warnings():
        for category in ours:
            # A lock is read where the job is bound: in the child process of a comparison too.
            warnings.simplefilter("always" if show or category is LockWarning else "ignore", category)
        shown = warnings.showwarning

        def show_warning(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, ours):
                print(f"veomni-ops {command}: warning: {message}", file=sys.stderr)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show_warning
        yield


def main(argv: Sequence[str] | None = None) -> int:
    from .config import ConfigError
    from .device import DeviceError
    from .discovery import PluginLoadError
    from .lock import LockError
    from .resolve import ResolutionError

    args = build_parser().parse_args(argv)
    refusals: tuple[type[BaseException], ...] = (
        ResolutionError, ConfigError, DeviceError, PluginLoadError, FileNotFoundError, IsADirectoryError, LockError,
    )
    try:
        from .binding import BindingError

        refusals += (BindingError,)
    except ImportError:  # binding needs torch; the listing commands do not
        pass
    try:
        from .train import RunFailed, TrainConfigError

        refusals += (RunFailed, TrainConfigError)
        from .tune import TuneError

        refusals += (TuneError,)
    except ImportError:
        pass
    # A run of `train --compare/--baseline` in its child process: the parent already showed the warnings.
    child = bool(getattr(args, "result_file", None))
    try:
        with _config_warnings(args.command, show=not child):
            return int(args.func(args) or 0)
    except refusals as e:
        _report(args, e, error_text(e))
        return 1
    except Exception as e:
        if args.command not in ("train", "tune"):
            raise
        # A training run (or a tune's) failed in a way no check foresaw: one line, the traceback on request.
        if os.environ.get(ENV_TRACE, "") not in ("", "0"):
            traceback.print_exc()
            hint = ""
        else:
            hint = f" (set {ENV_TRACE}=1 for the traceback)"
        _report(args, e, f"the run failed: {error_text(e, refusal=False)}{hint}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
