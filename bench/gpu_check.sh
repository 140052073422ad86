#!/usr/bin/env bash
# The runtime's CUDA path on a single-GPU machine, in one go (not run on a GPU yet: no GPU was
# lent while it was written; see docs/benchmarks-runtime.md). From the repository root, after
# `make setup TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"`:
#
#   bash bench/gpu_check.sh [OUT_DIR]
#
# 1. the CUDA tests (tests/gpu);
# 2. a one-rank bf16 training of gpt3-1.3b (~1.3B parameters), 20 steps, with --memory-report,
#    beside a plain PyTorch loop of the same model and dtype (tokens/s, MFU, hetpp / plain);
# 3. `hetpp profile --device cuda` of GPT layers beside the shipped H200 data.
set -euo pipefail
OUT=${1:-gpu-check}
PY=${PY:-.venv/bin/python}
HETPP=${HETPP:-.venv/bin/hetpp}
mkdir -p "$OUT"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"

echo "== 1. CUDA tests"
"$PY" -m pytest -q -m gpu tests/gpu

echo "== 2. one-rank bf16 gpt3-1.3b, 20 steps: hetpp train vs a plain loop"
cat > "$OUT/one-h200.yaml" <<YAML
name: one-h200
nodes:
  - {gpu: H200, gpus_per_node: 1, intra_node_GBps: 450}
inter_node_GBps: 25
YAML
"$HETPP" plan --cluster "$OUT/one-h200.yaml" --model gpt3-1.3b --global-batch 16 --seq-len 2048 \
    --precision bf16 --micro-batch-sizes 4 --recompute off --out "$OUT/plan.json"
"$HETPP" train --plan "$OUT/plan.json" --steps 20 --metrics "$OUT/run.jsonl" --memory-report \
    --lr 1e-4 | tee "$OUT/train.log"
"$PY" bench/plain_loop.py --plan "$OUT/plan.json" --steps 20 --hetpp-metrics "$OUT/run.jsonl" \
    | tee "$OUT/plain.log"

echo "== 3. hetpp profile --device cuda beside the shipped H200 data"
"$HETPP" profile --model gpt3-1.3b --device cuda --seq-len 2048 --micro-batch-sizes 1,2,4 \
    --gpu-name H200 --out "$OUT/h200-gpt3-1.3b.csv"
"$PY" - "$OUT/h200-gpt3-1.3b.csv" <<'PYCODE'
import csv, sys
shipped = {(int(r["mbs"]), r["layer"]): r for r in csv.DictReader(open("src/hetpp/data/h200_gpt_layers.csv"))
           if r["hidden"] == "2048" and r["seq"] == "2048"}
print("| layer | mbs | fwd ms now / shipped | bwd ms now / shipped |")
for r in csv.DictReader(open(sys.argv[1])):
    k = (int(r["mbs"]), {"head": "lm_head"}.get(r["layer"], r["layer"]))
    if k in shipped:
        s = shipped[k]
        print(f"| {r['layer']} | {r['mbs']} | {float(r['fwd_s']) * 1e3:.3f} / {float(s['fwd_ms']):.3f} "
              f"| {float(r['bwd_s']) * 1e3:.3f} / {float(s['bwd_ms']):.3f} |")
PYCODE
echo "done: $OUT"
