"""Training options of `hetpp train` (the local launcher) and `python -m hetpp.train` (one rank).

No torch here: the CLI registers these flags without paying for the torch import.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Literal

from hetpp.specs.errors import SpecError
from hetpp.specs.values import (
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    require,
)

DEFAULT_VERIFY_TOL = {"float32": 1e-5, "float64": 1e-10}
MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""A week: longer timeouts overflow the process group's timedelta and mean "never"."""


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """What one training run does; the plan file says where."""

    plan: str
    """Path of the plan JSON (it embeds the model and, for emulation, the cluster)."""
    steps: int = 10
    """Train until this optimizer step (a resumed run continues from its checkpoint's step)."""
    data: str | None = None
    """Token source: None for seeded synthetic tokens; a text file (bytes as tokens 0..255); or a
    `.bin` file of uint16 token ids."""
    seed: int = 0
    """Seed of the initial weights and of synthetic data (never depends on the plan)."""
    dtype: Literal["float32", "float64"] = "float32"
    """Weights, activations and gradients dtype."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = 1e-3
    """Learning rate (constant)."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW) or L2 penalty (SGD)."""
    clip_grad: float | None = None
    """Clip the global gradient norm (all stages, all pipelines, each parameter once) to this."""
    emulate: bool = False
    """CPU emulation: sleep after each forward/backward so each device runs as slow as its type."""
    verify: bool = False
    """After training, rank 0 reruns the steps in one process and compares parameters and losses.

    Meant for a few steps: AdamW's normalised update turns rounding differences in near-zero
    gradient entries into lr-sized ones, so over tens of steps the two runs drift apart (measured:
    float64, lr 3e-3, 1e-14 after 10 steps, 5e-9 after 30; SGD stays at rounding level)."""
    verify_tol: float | None = None
    """Largest allowed difference for --verify; default 1e-5 (float32) or 1e-10 (float64)."""
    checkpoint_dir: str | None = None
    """Directory of plan-independent checkpoints; one is written at the end of training."""
    checkpoint_every: int = 0
    """Also checkpoint every this many steps (0: only at the end)."""
    resume: bool = False
    """Start from the newest complete checkpoint in --checkpoint-dir (any plan, any rank count)."""
    metrics: str | None = None
    """Write one JSON object per step to this file (rank 0)."""
    timeout_s: float = 300.0
    """Collective/P2P timeout: a rank whose peer died or hangs stops after at most this long."""

    def __post_init__(self) -> None:
        positive = ("steps", "lr", "clip_grad", "timeout_s")
        non_negative = ("seed", "weight_decay", "verify_tol", "checkpoint_every")
        for name in positive + non_negative:
            value = getattr(self, name)
            if value is not None:
                bound = {"above": 0.0} if name in positive else {"least": 0.0}
                require(value, _flag(name), **bound)
        checks = (
            (self.seed < 2**63, "seed", "must be below 2**63"),
            (self.timeout_s <= MAX_TIMEOUT_S, "timeout_s", f"must be at most {MAX_TIMEOUT_S:g}"),
            (not self.resume or self.checkpoint_dir, "resume", "needs --checkpoint-dir"),
        )
        for ok, name, msg in checks:
            if not ok:
                raise SpecError(msg, field=_flag(name))

    @property
    def tolerance(self) -> float:
        return self.verify_tol if self.verify_tol is not None else DEFAULT_VERIFY_TOL[self.dtype]

    def to_argv(self) -> list[str]:
        """The command-line flags that reproduce these options (for the launcher's workers)."""
        argv: list[str] = []
        for f in dataclasses.fields(self):
            value, flag = getattr(self, f.name), "--" + f.name.replace("_", "-")
            if value is True:
                argv.append(flag)
            elif value is not None and value is not False:
                argv += [flag, str(value)]
        return argv


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register the training flags; `from_args` reads them back (unset flags keep the defaults)."""
    d = TrainOptions
    p.add_argument("--plan", required=True, help="plan JSON (from the planner or written by hand)")
    p.add_argument("--steps", type=positive_int, help=f"train until this step (default {d.steps})")
    p.add_argument(
        "--data", help="text file (bytes as tokens) or .bin uint16 tokens; default synthetic"
    )
    p.add_argument("--seed", type=non_negative_int, help="seed of weights and synthetic data")
    p.add_argument("--dtype", choices=("float32", "float64"), help=f"default {d.dtype}")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), help=f"default {d.optimizer}")
    p.add_argument("--lr", type=positive_float, help=f"learning rate (default {d.lr})")
    p.add_argument("--weight-decay", type=non_negative_float, help=f"default {d.weight_decay}")
    p.add_argument(
        "--clip-grad", type=positive_float, metavar="X", help="clip the global grad norm to X"
    )
    p.add_argument(
        "--emulate",
        action="store_true",
        help="CPU emulation of the plan's cluster: slow device types sleep",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="afterwards, compare with single-process training of the same steps",
    )
    p.add_argument(
        "--verify-tol",
        type=non_negative_float,
        metavar="T",
        help="allowed difference (default 1e-5 float32, 1e-10 float64)",
    )
    p.add_argument("--checkpoint-dir", metavar="D", help="plan-independent checkpoints go here")
    p.add_argument(
        "--checkpoint-every",
        type=non_negative_int,
        metavar="K",
        help="also checkpoint every K steps (default: only at the end)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest complete checkpoint in --checkpoint-dir",
    )
    p.add_argument("--metrics", metavar="F.jsonl", help="write per-step metrics here")
    p.add_argument(
        "--timeout-s",
        type=positive_float,
        metavar="S",
        help=f"give up on a silent peer after S seconds (default {d.timeout_s:g})",
    )


def from_args(args: argparse.Namespace) -> TrainOptions:
    """Options from parsed flags; raises SpecError naming a bad flag."""
    names = {f.name for f in dataclasses.fields(TrainOptions)}
    return TrainOptions(**{k: v for k, v in vars(args).items() if k in names and v is not None})
