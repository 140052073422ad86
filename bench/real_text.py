"""Training on real text: `hetpp data prepare` on the Python standard library's sources (with a
BPE trained on them), then `hetpp train` on a plan of two pipelines of different shapes, with a
validation loss every K steps. Prints the losses, writes the curve as a PNG and a markdown record.

    python bench/real_text.py [--steps 200] [--eval-every 10] [--out record.md]
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from hetpp.dataset.shards import open_dataset
from hetpp.demo.corpus import build_corpus
from hetpp.runtime.metrics import load_metrics
from hetpp.specs import PRESETS, PipelinePlan, Plan, StagePlan

MODEL, SEQ = "tiny-gpt", 128


def _plan() -> Plan:
    """Pipeline 0: two stages (embedding + 2 blocks | 2 blocks + head), 3 x 4 samples; pipeline 1:
    one stage, 2 x 2 samples: global batch 16."""
    two = PipelinePlan(
        stages=(StagePlan(devices=(0,), layers=(0, 3)), StagePlan(devices=(1,), layers=(3, 6))),
        micro_batch_size=4,
        num_micro_batches=3,
    )
    one = PipelinePlan(
        stages=(StagePlan(devices=(2,), layers=(0, 6)),), micro_batch_size=2, num_micro_batches=2
    )
    return Plan(global_batch=16, seq_len=SEQ, pipelines=(two, one), model=PRESETS[MODEL])


def _chart(records, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot([r.step for r in records], [r.loss for r in records], lw=1, label="train (batch)")
    val = [(r.step, r.val_loss) for r in records if r.val_loss is not None]
    ax.plot(*zip(*val), "o-", ms=3, label="validation (held-out files)")
    ax.set(xlabel="step", ylabel="mean token loss (nats)", title=f"{MODEL} on Python stdlib source")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--out", type=Path, help="also write the record to this markdown file")
    ap.add_argument("--png", type=Path, default=Path("docs/images/real-text-loss.png"))
    args = ap.parse_args()
    with TemporaryDirectory() as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        data = build_corpus(work / "corpus")
        prep_s = time.perf_counter() - t0
        ds = open_dataset(data)
        plan_path, metrics = work / "plan.json", work / "run.jsonl"
        _plan().validate_plan().save(plan_path)
        cmd = [
            "train",
            "--plan",
            str(plan_path),
            "--data",
            str(data),
            "--steps",
            str(args.steps),
            "--lr",
            "3e-3",
            "--warmup-steps",
            "20",
            "--lr-schedule",
            "cosine",
            "--weight-decay",
            "0.1",
            "--clip-grad",
            "1.0",
            "--eval-every",
            str(args.eval_every),
            "--eval-batches",
            "4",
            "--metrics",
            str(metrics),
        ]
        t1 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hetpp.cli.main", *cmd], check=True)
        train_s = time.perf_counter() - t1
        records = load_metrics(metrics)
    args.png.parent.mkdir(parents=True, exist_ok=True)
    _chart(records, args.png)
    text = _record(records, ds, prep_s, train_s, args.steps)
    print(text)
    if args.out is not None:
        image = args.png.resolve().relative_to(args.out.resolve().parent)
        args.out.write_text(f"# Training on real text\n\n{text}\n\n![loss curve]({image})\n")
    val = [r.val_loss for r in records if r.val_loss is not None]
    return 0 if val[-1] < val[0] else 1


def _record(records, ds, prep_s: float, train_s: float, steps: int) -> str:
    val_steps = [r.step for r in records if r.val_loss is not None]
    tokens = {s: sum(e["tokens"] for e in ds.index[s]) for s in ("train", "val")}
    rows = [
        f"| {r.step} | {r.loss:.4f} | {r.val_loss:.4f} | {r.lr:.2e} | {r.grad_norm:.3f} |"
        for r in records
        if r.val_loss is not None and (r.step in (val_steps[0], val_steps[-1]) or r.step % 50 == 0)
    ]
    return "\n".join(
        [
            f"Corpus: {ds.index['documents']} standard-library files, {tokens['train']:,} train "
            f"and {tokens['val']:,} validation tokens (every 20th file held out), BPE vocabulary "
            f"{ds.vocab_size}; tokenizer training + `hetpp data prepare`: {prep_s:.1f} s.",
            f"Model {MODEL}, seq_len {SEQ}, global batch 16 over two pipelines (2 stages, 1 "
            f"stage); {steps} steps in {train_s:.0f} s.",
            "",
            "| step | train loss | validation loss | lr | grad norm |",
            "| ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
            f"Command: `{shlex.join(['python', 'bench/real_text.py', *sys.argv[1:]])}`",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
