"""Stops for a run that has gone wrong: a non-finite loss or gradient norm ends training at that
step, on every rank (they all see the same all-reduced numbers), before a checkpoint of the
damaged weights could be written; the last complete checkpoint stays."""

from __future__ import annotations

import math


class NonFiniteError(RuntimeError):
    """Training produced NaN or infinity; the message names the step and what was seen."""


def check_step(step: int, loss: float, grad_norm: float | None) -> None:
    """Raise NonFiniteError unless this step's loss and gradient norm are finite."""
    bad = [f"loss {loss}"] if not math.isfinite(loss) else []
    if grad_norm is not None and not math.isfinite(grad_norm):
        bad.append(f"gradient norm {grad_norm}")
    if bad:
        raise NonFiniteError(
            f"step {step}: {' and '.join(bad)}; training stopped (lower --lr, or set "
            "--clip-grad); the last complete checkpoint, if any, is kept"
        )
