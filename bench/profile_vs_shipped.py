"""A `hetpp profile` CSV beside the shipped H200 GPT rows of the same hidden size, heads and
sequence length (`src/hetpp/data/h200_gpt_layers.csv`): forward and backward ms, now / shipped, as a
markdown table. Exits 1 when no row matches (a check that compares nothing must not pass).

    python bench/profile_vs_shipped.py h200-gpt3-1.3b.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from hetpp.specs.presets import PRESETS

SHIPPED = Path(__file__).resolve().parents[1] / "src" / "hetpp" / "data" / "h200_gpt_layers.csv"
NAMES = {"head": "lm_head"}
"""Layer names of `hetpp profile` that the shipped file spells differently."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", help="CSV written by `hetpp profile`")
    args = ap.parse_args()
    with open(args.profile, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(SHIPPED, newline="") as f:
        shipped = {
            (r["hidden"], r["heads"], r["seq"], r["layer"], r["mbs"]): r for r in csv.DictReader(f)
        }
    print("| layer | mbs | fwd ms now / shipped | bwd ms now / shipped |")
    print("| --- | ---: | ---: | ---: |")
    matched = 0
    for r in rows:
        c = PRESETS.get(r["model"])
        shape = (str(c.hidden_size), str(c.num_heads)) if c else ("?", "?")
        s = shipped.get((*shape, r["seq_len"], NAMES.get(r["layer"], r["layer"]), r["mbs"]))
        if s is None:
            continue
        matched += 1
        fwd, bwd = float(r["fwd_s"]) * 1e3, float(r["bwd_s"]) * 1e3
        print(
            f"| {r['layer']} | {r['mbs']} | {fwd:.3f} / {float(s['fwd_ms']):.3f} "
            f"| {bwd:.3f} / {float(s['bwd_ms']):.3f} |"
        )
    if not matched:
        sys.exit(
            f"no row of {args.profile} matches a shipped H200 row (hidden, heads, seq, layer, mbs)"
        )


if __name__ == "__main__":
    main()
