"""Per-step measurements, the JSONL log, and the measured summary a report sets beside a prediction.

No torch here: `summarize` and `load_metrics` work on a metrics file anywhere.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


@dataclass(frozen=True, kw_only=True)
class StepMetrics:
    """One optimizer step, as measured on every rank and gathered to rank 0."""

    step: int
    """Step number after this step (1 for the first step of a fresh run)."""
    loss: float
    """Mean token cross-entropy over the global batch (before the update)."""
    step_s: float
    """Wall time of the step: the slowest rank, from the start of the step to after its update."""
    samples_per_s: float
    tokens_per_s: float
    grad_norm: float | None
    """Global gradient norm before clipping."""
    compute_s: tuple[float, ...]
    """Per rank: forward/backward compute (stretched when emulating) and the optimizer update."""
    wait_s: tuple[float, ...]
    """Per rank: time in the pipeline schedule not spent computing (P2P waits, bubbles)."""
    comm_s: tuple[float, ...]
    """Per rank: gradient and tied-weight sync and the clipping all-reduce, including the wait for
    the other owners (other pipelines) to finish their backward."""
    lr: float | None = None
    """Learning rate of this step's update."""
    val_loss: float | None = None
    """Mean validation token loss after this step's update (steps with --eval-every only)."""


TIMES = ("compute_s", "wait_s", "comm_s", "step_s")
"""The seconds each rank measures per step, in the order `pack_step` packs them."""


def pack_step(loss: float, times: list[float], rank: int, world: int) -> list[float]:
    """One rank's share of the per-step all-reduce (SUM): its loss share, then its `TIMES` in
    its own slot, zeros elsewhere. Summed over ranks it is what `unpack_step` reads."""
    vec = [0.0] * (1 + len(TIMES) * world)
    vec[0] = loss
    vec[1 + len(TIMES) * rank : 1 + len(TIMES) * (rank + 1)] = times
    return vec


def unpack_step(
    step: int, vec: list[float], global_batch: int, seq_len: int, grad_norm: float | None
) -> StepMetrics:
    """The step's metrics from the summed `pack_step` vectors of every rank."""
    n = len(TIMES)
    per = [vec[1 + n * r : 1 + n * (r + 1)] for r in range((len(vec) - 1) // n)]
    step_s = max(p[3] for p in per)
    return StepMetrics(
        step=step,
        loss=vec[0],
        step_s=step_s,
        grad_norm=grad_norm,
        samples_per_s=global_batch / step_s,
        tokens_per_s=global_batch * seq_len / step_s,
        compute_s=tuple(p[0] for p in per),
        wait_s=tuple(p[1] for p in per),
        comm_s=tuple(p[2] for p in per),
    )


def summarize(records: list[StepMetrics], skip_first: bool = True) -> dict[str, Any]:
    """The measured summary of a run: medians over steps (the first step, which includes one-off
    set-up such as the pipeline's shape inference, is left out when there are others)."""
    steady = records[1:] if skip_first and len(records) > 1 else records
    n = len(steady[0].compute_s)

    def per_rank(field: str) -> list[float]:
        return [statistics.median(getattr(r, field)[k] for r in steady) for k in range(n)]

    return {
        "steps": len(records),
        "final_loss": records[-1].loss,
        "step_time_s": statistics.median(r.step_s for r in steady),
        "samples_per_s": statistics.median(r.samples_per_s for r in steady),
        "tokens_per_s": statistics.median(r.tokens_per_s for r in steady),
        "compute_s": per_rank("compute_s"),
        "wait_s": per_rank("wait_s"),
        "comm_s": per_rank("comm_s"),
    }


class MetricsLog:
    """Appends one JSON object per step to a file (flushed, so a crash keeps finished steps)."""

    def __init__(self, path: str | Path | None, append: bool, tensorboard: str | None = None):
        self.records: list[StepMetrics] = []
        self._file = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a" if append else "w")  # noqa: SIM115 - closed in close()
        self._tb = None
        if tensorboard is not None:  # optional: torch's writer needs the tensorboard package
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(tensorboard)

    def add(self, m: StepMetrics) -> None:
        self.records.append(m)
        self.write(asdict(m))
        if self._tb is not None:
            for key in ("loss", "val_loss", "lr", "grad_norm", "step_s", "tokens_per_s"):
                value = getattr(m, key)
                if value is not None:
                    self._tb.add_scalar(f"train/{key}", value, m.step)
            self._tb.flush()

    def write(self, record: dict[str, Any]) -> None:
        """One line as it is (steps have no "kind"; other records say theirs, e.g. "memory")."""
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def parse_record(line: str) -> StepMetrics:
    """One line of a metrics JSONL file."""
    d = json.loads(line)
    d.update({k: tuple(d[k]) for k in ("compute_s", "wait_s", "comm_s")})
    return StepMetrics(**d)


def load_metrics(path: str | Path) -> list[StepMetrics]:
    """Read a metrics JSONL file's step records back (records of another kind are skipped)."""
    lines = Path(path).read_text().splitlines()
    return [parse_record(line) for line in lines if '"kind":' not in line]


def load_records(path: str | Path, kind: str) -> list[dict[str, Any]]:
    """A metrics JSONL file's records of one kind (e.g. "memory")."""
    records = (json.loads(line) for line in Path(path).read_text().splitlines())
    return [r for r in records if r.get("kind") == kind]


def print_summary(records: list[StepMetrics], devices: list[int]) -> None:
    """A rich table of the summary: throughput and, per rank, where its time went."""
    s = summarize(records)
    console = Console()
    console.print(
        f"[bold]{s['steps']} steps[/]: median step {s['step_time_s'] * 1e3:.1f} ms, "
        f"{s['samples_per_s']:.1f} samples/s, {s['tokens_per_s']:.0f} tokens/s, "
        f"final loss {s['final_loss']:.4f}"
    )
    table = Table(title="median seconds per step, per rank")
    for col in ("rank", "device", "compute", "wait", "comm"):
        table.add_column(col, justify="right")
    for r, d in enumerate(devices):
        table.add_row(
            str(r), str(d), *(f"{s[k][r]:.4f}" for k in ("compute_s", "wait_s", "comm_s"))
        )
    console.print(table)


def print_progress(m: StepMetrics, steps: int) -> None:
    """One line per step on rank 0."""
    print(
        f"step {m.step}/{steps}  loss {m.loss:.4f}  {m.step_s * 1e3:.1f} ms  "
        f"{m.samples_per_s:.1f} samples/s  {m.tokens_per_s:.0f} tokens/s"
        + ("" if m.val_loss is None else f"  val {m.val_loss:.4f}"),
        flush=True,
    )
