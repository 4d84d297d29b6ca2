"""The ``veomni-ops`` command.

    veomni-ops plugins [--json]                      what is installed, loaded, usable here
    veomni-ops resolve CONFIG [--device D] [--json]  the plan a config gives on a device
    veomni-ops train CONFIG [--compare OTHER] [--baseline NAME]...
                                                     the main job (see veomni_ops.train)
    veomni-ops check [--backend NAME] [--op OP]      every usable kernel against the reference
    veomni-ops bench [--op OP] [--preset NAME]       every usable kernel against eager, timed

Exit codes: 0 ok; 1 the request was refused or a check failed (explanation on stderr);
2 bad usage.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

#: Subcommands that live in their own modules: name -> (module, help). Each module has
#: ``configure(parser)`` and ``run(args) -> int``; imported only when that command runs.
EXTERNAL_COMMANDS = {
    "train": ("veomni_ops.train", "train a model with a plan (the demo); see examples/"),
    "check": ("veomni_ops.testing.check", "check every usable kernel against the eager reference"),
    "bench": ("veomni_ops.bench", "benchmark every usable kernel against eager"),
}


def _cmd_plugins(args: argparse.Namespace) -> int:
    from .device import current_device
    from .discovery import discover
    from .resolve import kernel_problem

    reg = discover()
    dev = current_device(args.device)
    kernels = []
    for rk in reg:
        # Checks and, on this machine's device, an import of its kernel: one that fails is not usable.
        why = kernel_problem(rk, dev, training=False, registry=reg)
        kernels.append({**rk.spec.to_dict(), "distribution": rk.provenance.distribution,
                        "version": rk.provenance.version, "usable": why is None, "why_not": why or ""})
    if args.json:
        out = {"device": dev.to_dict(), "discovery_ms": round(reg.discovery_seconds * 1e3, 2),
               "plugins": [p.to_dict() for p in reg.plugins], "kernels": kernels}
        print(json.dumps(out, indent=2))
        return 0
    print(f"device: {dev}" + (f" ({dev.name})" if dev.name else ""))
    print(f"plugins (group veomni_ops.backends, discovered in {reg.discovery_seconds * 1e3:.1f} ms):")
    for p in reg.plugins:
        line = f"  {p.provenance.entry_point:<10} {p.provenance.distribution} {p.provenance.version}: {p.status}"
        if p.reason:
            line += f" - {p.reason}"
        if p.phase:
            line += f" (at {p.phase})"
        print(line)
    print("kernels:")
    rows = [("op", "variant", "kernel", "hardware", "from", "usable here")]
    for k in kernels:
        hw = k["hardware"]
        hwtxt = "/".join(hw["device_types"])
        if hw["min_capability"] or hw["max_capability"]:
            lo = ".".join(map(str, hw["min_capability"] or [])) or ""
            hi = ".".join(map(str, hw["max_capability"] or [])) or ""
            hwtxt += f" sm{lo}..{hi}"
        rows.append((k["op"], k["variant"], k["name"], hwtxt, k["distribution"],
                     "yes" if k["usable"] else f"no: {k['why_not']}"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r[:5], widths)) + "  " + r[5])
    return 0


def _cmd_resolve(args: argparse.Namespace) -> int:
    from .config import OpsConfig
    from .device import current_device
    from .resolve import resolve

    dev = current_device(args.device)
    cfg = OpsConfig.from_yaml(args.config)
    # Kernels are imported only when resolving for the device this process runs on.
    plan = resolve(cfg, dev, training=not args.inference)
    print(plan.to_json() if args.json else plan.table())
    return 0


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


def main(argv: Sequence[str] | None = None) -> int:
    from .config import ConfigError
    from .device import DeviceError
    from .discovery import PluginLoadError
    from .resolve import ResolutionError

    args = build_parser().parse_args(argv)
    refusals: tuple[type[BaseException], ...] = (
        ResolutionError, ConfigError, DeviceError, PluginLoadError, FileNotFoundError,
    )
    try:
        from .binding import BindingError

        refusals += (BindingError,)
    except ImportError:  # binding needs torch; the listing commands do not
        pass
    try:
        from .train import RunFailed, TrainConfigError

        refusals += (RunFailed, TrainConfigError)
    except ImportError:
        pass
    try:
        return int(args.func(args) or 0)
    except refusals as e:
        print(f"veomni-ops {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
