"""Predicted vs measured memory per rank over plan shapes (`hetpp train --memory-report`).

Each shape trains 3 steps on this CPU (gloo, one process per rank); the runtime counts model
states (with autocast's weight copies), what the in-flight micro-batches hold for backward
(saved-tensor hooks, the checkpoints' inputs and the stage's outputs; steady state from step 2)
and torch's receive buffers (read from the stage); the cost model predicts the same terms.
Prints one markdown row per rank.

    python bench/memory.py [--precisions fp32 bf16]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "dist"))

from disthelpers import make_plan, pipeline

from hetpp.runtime.metrics import load_records

SEQ = 128
SHAPES = {
    # name: (model, pipelines, schedule); r / n: recomputation on / off per stage
    "gpt (tied) 1f1b 3 stages": ("tiny-gpt", [pipeline([0, 1, 2], [0, 2, 4, 6], 2, 4)], "1f1b"),
    "gpt (tied) gpipe 2+1": (
        "tiny-gpt",
        [pipeline([0, 1], [0, 3, 6], 2, 3), pipeline([2], [0, 6], 2, 2)],
        "gpipe",
    ),
    "gpt (tied) 1f1b 2 stages recompute": (
        "tiny-gpt",
        [pipeline([0, 1], [0, 4, 6], 2, 4, recompute="rr")],
        "1f1b",
    ),
    "llama 1f1b 3+1": (
        "tiny-llama",
        [pipeline([0, 1, 2], [0, 2, 4, 6], 1, 6), pipeline([3], [0, 6], 2, 2)],
        "1f1b",
    ),
    "llama gpipe 2 stages recompute": (
        "tiny-llama",
        [pipeline([0, 1], [0, 3, 6], 2, 3, recompute="rr")],
        "gpipe",
    ),
    "llama 1f1b 2+2 mixed recompute": (
        "tiny-llama",
        [pipeline([0, 1], [0, 3, 6], 2, 4, recompute="rn"), pipeline([2, 3], [0, 2, 6], 2, 2)],
        "1f1b",
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    args = ap.parse_args()
    print(
        "| shape | precision | rank | stage | recompute | predicted MB | measured MB | error "
        "| of which buffers MB (predicted / measured) |"
    )
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, pipes, schedule) in SHAPES.items():
            for precision in args.precisions:
                plan = make_plan(model, pipes, schedule, seq_len=SEQ, precision=precision)
                path, metrics = Path(tmp) / "plan.json", Path(tmp) / "m.jsonl"
                plan.save(path)
                cmd = ["hetpp", "train", "--plan", str(path), "--steps", "3", "--memory-report"]
                subprocess.run(
                    [*cmd, "--metrics", str(metrics)], check=True, capture_output=True, text=True
                )
                for r in load_records(metrics, "memory"):
                    st = plan.pipelines[r["pipeline"]].stages[r["stage"]]
                    print(
                        f"| {name} | {precision} | {r['rank']} | {r['pipeline']}.{r['stage']} | "
                        f"{'on' if st.recomputes(plan.train) else 'off'} | "
                        f"{r['predicted_bytes'] / 1e6:.2f} | {r['measured_bytes'] / 1e6:.2f} | "
                        f"{r['error']:+.1%} | {r['predicted_recv_buffer_bytes'] / 1e6:.2f} / "
                        f"{r['measured_recv_buffer_bytes'] / 1e6:.2f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
