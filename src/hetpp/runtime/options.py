"""Training options of `hetpp train` (the local launcher) and `python -m hetpp.train` (one rank).

No torch here: the CLI registers these flags without paying for the torch import.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass
from typing import Literal

from pydantic import TypeAdapter, ValidationError

from hetpp.specs.errors import SpecError
from hetpp.specs.values import (
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    require,
)

DEFAULT_VERIFY_TOL = {"fp32": 1e-5, "fp64": 1e-10, "bf16": 2e-2, "fp16": 1e-2}
"""--verify's default tolerance per executed precision (`runtime.precision.Precision.name`).
bf16 / fp16: twice the largest drift `bench/verify_precision.py` measured over 10 steps of AdamW
at lr 1e-3 (docs/benchmarks-runtime.md); the drift grows with lr and steps."""
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
    """Token source: None for seeded synthetic tokens; a dataset from `hetpp data prepare` (its
    folder or index.json); a text file (bytes as tokens 0..255); or a `.bin` of uint16 ids."""
    seed: int = 0
    """Seed of the initial weights and of synthetic data (never depends on the plan)."""
    fp64: bool = False
    """Run an fp32 plan in float64 (exactness tests); otherwise the plan's `train.precision`
    decides the dtypes."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = 1e-3
    """Peak learning rate (reached after --warmup-steps; --lr-schedule decides the rest)."""
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
    docs/benchmarks-runtime-choices.md; SGD stays at rounding level)."""
    verify_tol: float | None = None
    """Largest allowed difference for --verify; default per precision (`DEFAULT_VERIFY_TOL`)."""
    checkpoint_dir: str | None = None
    """Directory of plan-independent checkpoints; one is written at the end of training."""
    checkpoint_every: int = 0
    """Also checkpoint every this many steps (0: only at the end)."""
    resume: bool = False
    """Start from the newest complete checkpoint in --checkpoint-dir (any plan, any rank count)."""
    metrics: str | None = None
    """Write one JSON object per step to this file (rank 0)."""
    memory_report: bool = False
    """Measure what each rank keeps (model states, activations saved for backward) and set it
    beside the cost model's prediction; `{"kind": "memory", ...}` records go to --metrics."""
    timeout_s: float = 300.0
    """Collective/P2P timeout: a rank whose peer died or hangs stops after at most this long."""
    # Models, data and schedules (issue 11).
    init_from: str | None = None
    """Hugging Face model folder (config.json + safetensors) to start from; each rank reads only
    its own layers. A resumed checkpoint takes precedence."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """After warm-up: keep --lr, or decay it (cosine or linear) to lr x min_lr_ratio at --steps."""
    warmup_steps: int = 0
    """Linear warm-up from lr/warmup_steps to lr over this many steps."""
    min_lr_ratio: float = 0.1
    """Final learning rate of a decaying schedule, as a fraction of --lr."""
    decay_steps: int | None = None
    """Step at which a decaying schedule reaches its end; default --steps (set it when a run is
    trained in several parts, each stopping early with --steps)."""
    eval_every: int = 0
    """Validation loss every this many steps and after the last one (0: never)."""
    eval_batches: int = 1
    """Global batches of held-out samples per validation (same shapes as training)."""
    tensorboard: str | None = None
    """Also log the metrics to TensorBoard event files in this folder (needs `tensorboard`)."""

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
            (self.warmup_steps >= 0, "warmup_steps", "must be 0 or more"),
            (0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be between 0 and 1"),
            (self.eval_every >= 0, "eval_every", "must be 0 or more"),
            (self.decay_steps is None or self.decay_steps >= 1, "decay_steps", "must be positive"),
            (self.eval_batches >= 1, "eval_batches", "must be at least 1"),
        )
        for ok, name, msg in checks:
            if not ok:
                raise SpecError(msg, field=_flag(name))

    def eval_due(self, step: int) -> bool:
        """Whether validation runs after `step` (every --eval-every steps and after the last)."""
        return self.eval_every > 0 and (step % self.eval_every == 0 or step == self.steps)

    def tolerance(self, precision: str) -> float:
        """--verify's tolerance for a run in `precision` (a `Precision.name`)."""
        return self.verify_tol if self.verify_tol is not None else DEFAULT_VERIFY_TOL[precision]

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
    p.add_argument("--plan", help="plan JSON (from the planner or written by hand); required")
    p.add_argument("--steps", type=positive_int, help=f"train until this step (default {d.steps})")
    p.add_argument(
        "--data",
        help="dataset folder from `hetpp data prepare`, a .txt (bytes as tokens) or a .bin of "
        "uint16 ids; default synthetic",
    )
    p.add_argument("--seed", type=non_negative_int, help="seed of weights and synthetic data")
    p.add_argument(
        "--fp64",
        action="store_true",
        help="run an fp32 plan in float64 (exactness tests); otherwise the plan's precision rules",
    )
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
        help="allowed difference (default 1e-5; 1e-10 with --fp64)",
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
        "--memory-report",
        action="store_true",
        help="measure each rank's memory and print it beside the cost model's prediction",
    )
    p.add_argument(
        "--timeout-s",
        type=positive_float,
        metavar="S",
        help=f"give up on a silent peer after S seconds (default {d.timeout_s:g})",
    )
    _add_model_data_arguments(p)


def _add_model_data_arguments(p: argparse.ArgumentParser) -> None:
    d = TrainOptions
    p.add_argument(
        "--config",
        metavar="RUN.toml",
        help="options from a TOML file (keys: the option names, e.g. lr = 3e-4, "
        "checkpoint_dir = 'ckpt'); flags given on the command line override it",
    )
    p.add_argument(
        "--init-from",
        metavar="DIR",
        help="start from a Hugging Face model folder (config.json + model.safetensors)",
    )
    p.add_argument(
        "--lr-schedule",
        choices=("constant", "cosine", "linear"),
        help=f"after warm-up (default {d.lr_schedule})",
    )
    p.add_argument("--warmup-steps", type=int, metavar="N", help="linear warm-up steps")
    p.add_argument(
        "--min-lr-ratio",
        type=float,
        metavar="R",
        help=f"decay to lr x R (default {d.min_lr_ratio})",
    )
    p.add_argument(
        "--decay-steps", type=int, metavar="N", help="schedule ends at step N (default --steps)"
    )
    p.add_argument(
        "--eval-every", type=int, metavar="K", help="validation loss every K steps and at the end"
    )
    p.add_argument(
        "--eval-batches",
        type=int,
        metavar="N",
        help=f"global batches per validation (default {d.eval_batches})",
    )
    p.add_argument("--tensorboard", metavar="DIR", help="also write TensorBoard events here")


def from_args(args: argparse.Namespace) -> TrainOptions:
    """Options from parsed flags over the --config file's; raises SpecError naming a bad one."""
    names = {f.name for f in dataclasses.fields(TrainOptions)}
    values = read_config(args.config) if getattr(args, "config", None) else {}
    values |= {
        k: v for k, v in vars(args).items() if k in names and v is not None and v is not False
    }
    if "plan" not in values:
        raise SpecError("required: a plan file (--plan, or plan = ... in --config)", field="--plan")
    try:
        return TrainOptions(**values)
    except SpecError as e:
        raise e.in_file(args.config) if getattr(args, "config", None) else e from None


def read_config(path: str) -> dict:
    """A TOML file of train options, type-checked against TrainOptions; unknown keys are errors."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror}", file=path) from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"not valid TOML: {e}", file=path) from None
    known = {f.name for f in dataclasses.fields(TrainOptions)}
    for key in data:
        if key not in known:
            raise SpecError(
                f"unknown option; expected one of {', '.join(sorted(known))}", file=path, field=key
            )
    hints = typing.get_type_hints(TrainOptions)
    for key, value in data.items():
        try:
            TypeAdapter(hints[key]).validate_python(value, strict=True)
        except ValidationError as e:
            msg = e.errors()[0]["msg"]
            raise SpecError(f"{msg}, got {value!r}", file=path, field=key) from None
    return data
