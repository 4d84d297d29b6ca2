"""The ``veomni-ops new-backend`` command: its options, and what it says it wrote."""

from __future__ import annotations

import argparse
import sys

from .writer import NewBackendError, names_for, write_backend


def configure(p: argparse.ArgumentParser) -> None:
    p.description = ("Write a new backend: a copy of the backend template (one SwiGLU kernel in plain PyTorch, its "
                     "spec, tests and ci.sh) with every name changed for NAME.")
    p.add_argument("name", metavar="NAME", help="the kernel name and entry point (what a config writes: "
                                                "swiglu_mlp_implementation: NAME)")
    p.add_argument("dir", metavar="DIR", nargs="?", help="where to write it (absent or empty; default ./DIST)")
    p.add_argument("--distribution", metavar="DIST", help="the distribution's name (default veomni-backend-NAME); "
                                                          "the package is DIST with '_' for '-'")


def run(args: argparse.Namespace) -> int:
    try:
        names = names_for(args.name, args.distribution)
        folder = args.dir or names.distribution
        written = write_backend(names, folder)
    except NewBackendError as e:
        print(f"veomni-ops new-backend: {e}", file=sys.stderr)
        return 1
    print(f"wrote {names.distribution} in {folder} ({len(written)} files): distribution {names.distribution}, "
          f"package {names.package} (src/{names.package}), entry point and kernel name {names.name}")
    print(f"next: cd {folder} && PYTHON=python ./ci.sh    # builds, installs, tests and checks it, then uninstalls it")
    print(f"then: write your kernel in src/{names.package}/kernels/, declare it in src/{names.package}/specs.py "
          f"(its priority stays 0 until it should win auto for everyone who installs it); "
          "docs/writing-a-backend.md in veomni-ops walks through every file")
    return 0
