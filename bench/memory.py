"""Predicted vs measured memory per rank over plan shapes (`hetpp train --memory-report`).

Each shape trains 3 steps on this CPU (gloo, one process per rank); the runtime counts model
states (with autocast's weight copies), what the in-flight micro-batches hold for backward
(saved-tensor hooks, the checkpoints' inputs and the stage's outputs; steady state from step 2)
and torch's receive buffers (read from the stage); the cost model predicts the same terms.
Prints one markdown row per rank; a rank running several stages (interleaved and V schedules) is
one row, measured as one rank and predicted as the planner charges its device
(`cost.step.device_memories`).

    python bench/memory.py [--precisions fp32 bf16] [--only SUBSTRING ...]
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
RECOMPUTE = {frozenset({True}): "on", frozenset({False}): "off", frozenset({True, False}): "mixed"}
"""The recompute column of a rank from its stages' flags."""
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

MULTI_STAGE_SHAPES = {
    # every schedule `hetpp train` runs besides 1F1B and GPipe; a stage's device list gives the
    # placement (loop: stage i on device i mod D; V: i down, 2D-1-i back)
    "gpt (tied) zbh1 3 stages": (
        "tiny-gpt",
        [pipeline([0, 1, 2], [0, 2, 4, 6], 2, 6, schedule="zbh1")],
        "zbh1",
    ),
    "llama zbh1 2+2": (
        "tiny-llama",
        [pipeline([0, 1], [0, 3, 6], 2, 4), pipeline([2, 3], [0, 2, 6], 1, 6)],
        "zbh1",
    ),
    "gpt (tied) interleaved-1f1b 2 devices": (
        "tiny-gpt",
        [pipeline([0, 1, 0, 1], [0, 2, 3, 4, 6], 2, 4)],
        "interleaved-1f1b",
    ),
    "llama interleaved-1f1b 3 devices recompute": (
        "tiny-llama",
        [pipeline([0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6], 1, 6, recompute="nrrrrn")],
        "interleaved-1f1b",
    ),
    "gpt (tied) interleaved-zb 2 devices": (
        "tiny-gpt",
        [pipeline([0, 1, 0, 1], [0, 2, 3, 4, 6], 2, 4)],
        "interleaved-zb",
    ),
    "llama interleaved-zb 2 devices + 1f1b 2": (
        "tiny-llama",
        [
            pipeline([0, 1, 0, 1], [0, 2, 3, 4, 6], 2, 4, schedule="interleaved-zb"),
            pipeline([2, 3], [0, 3, 6], 1, 4),
        ],
        "1f1b",
    ),
    "gpt (tied) zbv 2 devices": (
        "tiny-gpt",
        [pipeline([0, 1, 1, 0], [0, 2, 3, 4, 6], 2, 4)],
        "zbv",
    ),
    "llama zbv 2 devices recompute": (
        "tiny-llama",
        [pipeline([0, 1, 1, 0], [0, 2, 3, 4, 6], 2, 4, recompute="nrrn")],
        "zbv",
    ),
    "gpt (tied) dualpipev 2 devices": (
        "tiny-gpt",
        [pipeline([0, 1, 1, 0], [0, 2, 3, 4, 6], 1, 6)],
        "dualpipev",
    ),
    "llama dualpipev 2 devices": (
        "tiny-llama",
        [pipeline([0, 1, 1, 0], [0, 2, 3, 4, 6], 2, 4)],
        "dualpipev",
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--only", nargs="+", default=[""], help="shapes whose name holds one of these")
    args = ap.parse_args()
    shapes = {
        name: shape
        for name, shape in {**SHAPES, **MULTI_STAGE_SHAPES}.items()
        if any(part in name for part in args.only)
    }
    print(
        "| shape | precision | rank | stage | recompute | predicted MB | measured MB | error "
        "| of which buffers MB (predicted / measured) |"
    )
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, pipes, schedule) in shapes.items():
            for precision in args.precisions:
                plan = make_plan(model, pipes, schedule, seq_len=SEQ, precision=precision)
                path, metrics = Path(tmp) / "plan.json", Path(tmp) / "m.jsonl"
                plan.save(path)
                cmd = ["hetpp", "train", "--plan", str(path), "--steps", "3", "--memory-report"]
                subprocess.run(
                    [*cmd, "--metrics", str(metrics)], check=True, capture_output=True, text=True
                )
                for r in load_records(metrics, "memory"):
                    pipe = plan.pipelines[r["pipeline"]]
                    flags = {pipe.stages[s].recomputes(plan.train) for s in r["stages"]}
                    stages = "+".join(f"{r['pipeline']}.{s}" for s in r["stages"])
                    print(
                        f"| {name} | {precision} | {r['rank']} | {stages} | "
                        f"{RECOMPUTE[frozenset(flags)]} | "
                        f"{r['predicted_bytes'] / 1e6:.2f} | {r['measured_bytes'] / 1e6:.2f} | "
                        f"{r['error']:+.1%} | {r['predicted_recv_buffer_bytes'] / 1e6:.2f} / "
                        f"{r['measured_recv_buffer_bytes'] / 1e6:.2f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
