"""How far pipelined mixed-precision training drifts from the single-process reference.

For each plan shape, precision (bf16, fp16), optimizer (AdamW lr 1e-3, SGD lr 0.1) and step count,
trains on forked gloo ranks with --verify (the reference runs the same micro-batches in one process
in the same precision) and prints (to stderr) the largest parameter and loss differences.
`--verify`'s bf16 and fp16 tolerances (`runtime/options.py`, `DEFAULT_VERIFY_TOL`) come from this
table (docs/benchmarks-runtime.md).

    python bench/verify_precision.py [--steps 3 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "dist"))

from disthelpers import make_plan, pipeline, train

SHAPES = {
    "gpt 1 pipe x 3 stages": ("tiny-gpt", [pipeline([0, 1, 2], [0, 2, 4, 6], 2, 3)], "1f1b"),
    "gpt 2+1 stages": (
        "tiny-gpt",
        [pipeline([0, 1], [0, 2, 6], 2, 5), pipeline([2], [0, 6], 3, 2)],
        "1f1b",
    ),
    "gpt 4+2+1 gpipe": (
        "tiny-gpt",
        [
            pipeline([0, 1, 5, 4], [0, 1, 3, 5, 6], 1, 8),
            pipeline([3, 6], [0, 4, 6], 2, 2),
            pipeline([2], [0, 6], 4, 1),
        ],
        "gpipe",
    ),
    "llama 3+2": (
        "tiny-llama",
        [pipeline([0, 1, 2], [0, 2, 4, 6], 2, 3), pipeline([3, 4], [0, 3, 6], 1, 4)],
        "1f1b",
    ),
    "llama 2+1+2": (
        "tiny-llama",
        [
            pipeline([0, 1], [0, 3, 6], 1, 4),
            pipeline([2], [0, 6], 2, 2),
            pipeline([3, 4], [0, 2, 6], 2, 2),
        ],
        "1f1b",
    ),
    "llama 1+3+2 gpipe": (
        "tiny-llama",
        [
            pipeline([0], [0, 6], 2, 2),
            pipeline([1, 2, 3], [0, 1, 5, 6], 2, 3),
            pipeline([4, 5], [0, 2, 6], 1, 2),
        ],
        "gpipe",
    ),
}
OPTIMIZERS = {"adamw": {"optimizer": "adamw", "lr": 1e-3}, "sgd": {"optimizer": "sgd", "lr": 0.1}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[3, 10])
    ap.add_argument("--precisions", nargs="+", default=["bf16", "fp16"])
    args = ap.parse_args()
    # The table goes to stderr: the ranks' progress lines fill stdout.
    print(
        "| shape | precision | optimizer | steps | max param diff | max loss diff |",
        file=sys.stderr,
    )
    print("| --- | --- | --- | ---: | ---: | ---: |", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, pipes, schedule) in SHAPES.items():
            for precision in args.precisions:
                plan = make_plan(model, pipes, schedule, precision=precision)
                for opt, kw in OPTIMIZERS.items():
                    for steps in args.steps:
                        r = train(plan, Path(tmp), steps=steps, verify=True, verify_tol=1.0, **kw)
                        v = r[0].verify
                        print(
                            f"| {name} | {precision} | {opt} | {steps} | "
                            f"{v.max_param_diff:.2e} | {v.max_loss_diff:.2e} |",
                            file=sys.stderr,
                            flush=True,
                        )


if __name__ == "__main__":
    main()
