"""Range checks of scalar option values, shared by the command-line parsers and the option
dataclasses, so `--lr inf`, `--seq-len 0` or `--reserve-gb nan` are refused the same way
everywhere, before anything runs. (Spec files get the same checks from pydantic.)"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from hetpp.specs.errors import SpecError


def require(value: float, field: str, *, above: float | None = None, least: float | None = None):
    """SpecError naming `field` unless `value` is finite and `> above` / `>= least`."""
    if not math.isfinite(value):
        raise SpecError(f"expected a finite number, got {value}", field=field)
    if above is not None and not value > above:
        raise SpecError(f"expected a number above {above:g}, got {value:g}", field=field)
    if least is not None and not value >= least:
        raise SpecError(f"expected a number of at least {least:g}, got {value:g}", field=field)


def _arg_type(parse: Callable[[str], float], what: str, **bounds: float) -> Callable[[str], float]:
    def convert(text: str) -> float:
        try:
            value = parse(text)
            require(value, "", **bounds)
        except (ValueError, OverflowError):  # SpecError is a ValueError
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        return value

    convert.__name__ = what  # argparse names the type in some messages
    return convert


positive_int = _arg_type(int, "a positive integer", least=1)
non_negative_int = _arg_type(int, "an integer >= 0", least=0)
positive_float = _arg_type(float, "a finite number > 0", above=0)
non_negative_float = _arg_type(float, "a finite number >= 0", least=0)


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage before its error; one line that names the option and
    points to --help is easier to read, and to test (bad input always ends in one line)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
