"""The two-pipeline plan behind docs/images/gantt-two-pipelines.png.

    .venv/bin/python bench/gantt_example.py /tmp/two-pipelines.json
    .venv/bin/hetpp simulate /tmp/two-pipelines.json --gantt docs/images/gantt-two-pipelines.png

gpt3-1.3b (seq 2048) on examples/a100-v100.yaml: one pipeline of 2 A100-80GB, one of 4 V100-32GB
(one node each), micro-batch size 2, global batch 32 split by speed, 1F1B.
"""

from __future__ import annotations

import sys

from simplans import ROOT, make_plan

from hetpp.specs import load_cluster


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "two-pipelines.json"
    cluster = load_cluster(ROOT / "examples" / "a100-v100.yaml")
    plan = make_plan(cluster, "gpt3-1.3b", [[0, 1], [16, 17, 18, 19]], mbs=2, global_batch=32)
    plan.save(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
