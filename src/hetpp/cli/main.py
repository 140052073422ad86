"""`hetpp` entry point: dispatches to one module per subcommand, turns bad input into exit 2."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from hetpp.specs.errors import SpecError


def _command_modules() -> list[str]:
    """Every module in hetpp.cli except this one: each exposes `register(subparsers)`.

    Heavy imports (torch, matplotlib) stay inside the command functions, so `hetpp --help` and the
    planning commands start fast."""
    import hetpp.cli

    return sorted(m.name for m in pkgutil.iter_modules(hetpp.cli.__path__) if m.name != "main")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetpp",
        description="Plan, simulate and train transformers on heterogeneous GPU clusters.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _command_modules():
        importlib.import_module(f"hetpp.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SpecError as e:
        print(f"hetpp {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
