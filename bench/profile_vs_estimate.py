"""A `hetpp profile` CSV beside what the estimator predicts for the same layer, GPU type, model,
sequence length, micro-batch size and precision: forward and backward ms, measured / predicted,
as a markdown table. The check of the cost model against a device it has not seen in this form
(bench/gpu_check.sh runs it on the rows it measures). Exits 1 when no row can be compared.

    python bench/profile_vs_estimate.py h200.csv --dtype bf16
"""

from __future__ import annotations

import argparse
import csv
import sys

from hetpp.profile.estimator import estimate_layer
from hetpp.specs.catalog import CATALOG
from hetpp.specs.model import ModelSpec
from hetpp.specs.presets import PRESETS

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def _layer(model: ModelSpec, kind: str):
    """The layer a profile row of `kind` measured: profiles time whole blocks."""
    return {"embedding": model.layers[0], "block": model.block_layer, "head": model.layers[-1]}[
        kind
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", help="CSV written by `hetpp profile`")
    ap.add_argument("--dtype", choices=sorted(DTYPE_BYTES), required=True)
    args = ap.parse_args()
    with open(args.profile, newline="") as f:
        rows = list(csv.DictReader(f))
    print(f"{args.profile}, {args.dtype}:\n")
    print("| layer | mbs | fwd ms measured / predicted | bwd ms measured / predicted |")
    print("| --- | ---: | ---: | ---: |")
    compared = 0
    for r in rows:
        config, gpu = PRESETS.get(r["model"]), CATALOG.get(r["gpu"].lower())
        if config is None or gpu is None:
            print(
                f"| {r['layer']} | {r['mbs']} | (no preset or catalog type for "
                f"{r['model']!r} on {r['gpu']!r}) | |"
            )
            continue
        model = ModelSpec(
            config=config, seq_len=int(r["seq_len"]), dtype_bytes=DTYPE_BYTES[args.dtype]
        )
        pf, pb = estimate_layer(_layer(model, r["layer"]), model, int(r["mbs"]), gpu)
        mf, mb = float(r["fwd_s"]), float(r["bwd_s"])
        compared += 1
        print(
            f"| {r['layer']} | {r['mbs']} | {mf * 1e3:.3f} / {pf * 1e3:.3f} ({mf / pf:.2f}x) "
            f"| {mb * 1e3:.3f} / {pb * 1e3:.3f} ({mb / pb:.2f}x) |"
        )
    if not compared:
        sys.exit(f"no row of {args.profile} names a preset model and a catalog GPU type")


if __name__ == "__main__":
    main()
