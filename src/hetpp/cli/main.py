"""`hetpp` entry point: dispatches to one module per subcommand, turns bad input into exit 2."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import pkgutil
import sys

from hetpp.specs.errors import SpecError
from hetpp.specs.values import OneLineParser


def _command_modules() -> list[str]:
    """Every module in hetpp.cli except this one and `_private` ones: each exposes
    `register(subparsers)`.

    Heavy imports (torch, matplotlib) stay inside the command functions, so `hetpp --help` and the
    planning commands start fast."""
    import hetpp.cli

    names = (m.name for m in pkgutil.iter_modules(hetpp.cli.__path__))
    return sorted(n for n in names if n != "main" and not n.startswith("_"))


def _version() -> str:
    try:
        return importlib.metadata.version("hetpp")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="hetpp",
        description="Plan, simulate and train transformers on heterogeneous GPU clusters.",
    )
    parser.add_argument("--version", action="version", version=f"hetpp {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _command_modules():
        importlib.import_module(f"hetpp.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    if not sys.stdout.isatty():
        # rich falls back to 80 columns when piped, which squeezes the wide plan tables into
        # unreadable cells; logs and CI output can afford more.
        os.environ.setdefault("COLUMNS", "140")
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, or a bad option (one line already printed)
        return int(e.code or 0)
    try:
        return int(args.func(args) or 0)
    except SpecError as e:
        print(f"hetpp {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file system error no reader turned into a SpecError
        where = f"{e.filename}: " if e.filename else ""
        print(f"hetpp {args.command}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
