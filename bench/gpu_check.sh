#!/usr/bin/env bash
# The runtime's CUDA path on a fresh single-GPU machine, unattended, in about 8 minutes at most
# (not run on a GPU yet: none was lent while it was written; see docs/benchmarks-runtime.md).
#
#   bash bench/gpu_check.sh [--dry-run] [OUT_DIR]      # from the repository root
#
# OUT_DIR defaults to $OUT when set, else ./gpu-check. It receives six files: summary.md (the
# figures), gpu_check.log (everything printed), plan.json, run.jsonl (hetpp's metrics and memory
# records), profile.csv and profile_vs_shipped.md. Set-up needs no network:
#   - Python: $PY if set; else .venv/bin/python if its torch sees a GPU; else the machine's
#     python3 (a CUDA build of torch in its site-packages), with src/ on PYTHONPATH.
#   - Python packages it lacks (pydantic on a bare CUDA image, say) are installed from wheels in
#     $WHEELS (default .whl/, ignored by git; for pydantic: pydantic, pydantic-core,
#     annotated-types, typing-inspection) into a temporary folder, offline; anything still missing
#     stops the check naming it.
# Steps, each under a time limit (`timeout`), any failure ends the check with a non-zero status:
#   1. the CUDA tests (tests/gpu);
#   2. a one-rank bf16 training of gpt3-1.3b (~1.3B parameters), 20 steps, with --memory-report,
#      beside a plain PyTorch loop of the same model and precision (tokens/s, MFU, hetpp / plain);
#   3. `hetpp profile --device cuda` of gpt3-1.3b's layers beside the shipped H200 rows.
# --dry-run does all of it on the CPU with tiny-gpt (2 steps; no CUDA tests, no H200 rows to
# compare): it checks the script, the set-up and every command line, not the GPU.
set -euo pipefail
trap 'echo "gpu_check: FAILED (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then
    DRY=1
    shift
fi
OUT=$(mkdir -p "${1:-${OUT:-gpu-check}}" && cd "${1:-${OUT:-gpu-check}}" && pwd)
cd "$(dirname "$0")/.."
WORK=$(mktemp -d)
exec > >(tee "$OUT/gpu_check.log") 2>&1
echo "gpu_check: $(date -u +%FT%TZ), output in $OUT, dry run: $DRY"

# --- set-up (offline) ------------------------------------------------------------------------
sees_gpu() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
if [[ -z "${PY:-}" ]]; then
    if [[ -x .venv/bin/python ]] && { [[ $DRY == 1 ]] || sees_gpu .venv/bin/python; }; then
        PY=.venv/bin/python
    else
        PY=$(command -v python3)
    fi
fi
WHEELS=${WHEELS:-.whl}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WHEELS"/*.whl
    export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" - <<'PYCODE'
import importlib.util, sys
need = ["torch", "numpy", "pydantic", "yaml", "rich", "matplotlib", "safetensors", "pytest",
        "hypothesis", "hetpp"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_check: missing Python packages {missing}: no network here; put their wheels "
             "in $WHEELS (default .whl/) and run again")
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}")
PYCODE
hetpp() { "$PY" -m hetpp.cli.main "$@"; }
if [[ $DRY == 1 ]]; then
    DEVICE=cpu MODEL=tiny-gpt SEQ=128 STEPS=2 BATCH=4 MBS=2 LIMIT=3
else
    DEVICE=cuda MODEL=gpt3-1.3b SEQ=2048 STEPS=20 BATCH=16 MBS=4 LIMIT=1
    "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
fi
# A step's time limit in seconds: $1 on the GPU (the sum stays under 8 minutes), LIMIT times that
# in a dry run on a shared CPU.
limit() { echo $(($1 * LIMIT)); }

# --- 1. CUDA tests -----------------------------------------------------------------------------
echo "== 1. CUDA tests"
if [[ $DRY == 1 ]]; then
    echo "(dry run: tests/gpu collected only)"
    "$PY" -m pytest -q --collect-only -m gpu tests/gpu
else
    timeout "$(limit 90)" "$PY" -m pytest -q -m gpu tests/gpu
fi

# --- 2. one-rank bf16 training vs a plain loop ------------------------------------------------
echo "== 2. one-rank bf16 $MODEL, $STEPS steps: hetpp train vs a plain loop"
cat >"$WORK/one-h200.yaml" <<YAML
name: one-h200
nodes:
  - {gpu: H200, gpus_per_node: 1, intra_node_GBps: 450}
inter_node_GBps: 25
YAML
hetpp plan --cluster "$WORK/one-h200.yaml" --model "$MODEL" --global-batch "$BATCH" \
    --seq-len "$SEQ" --precision bf16 --micro-batch-sizes "$MBS" --recompute off \
    --out "$OUT/plan.json"
timeout "$(limit 180)" "$PY" -m hetpp.cli.main train --plan "$OUT/plan.json" --steps "$STEPS" \
    --metrics "$OUT/run.jsonl" --memory-report --lr 1e-4
timeout "$(limit 90)" "$PY" bench/plain_loop.py --plan "$OUT/plan.json" --steps "$STEPS" \
    --device "$DEVICE" --hetpp-metrics "$OUT/run.jsonl" | tee "$WORK/plain.log"

# --- 3. profile beside the shipped H200 rows --------------------------------------------------
echo "== 3. hetpp profile --device $DEVICE beside the shipped H200 data"
timeout "$(limit 90)" "$PY" -m hetpp.cli.main profile --model "$MODEL" --device "$DEVICE" \
    --seq-len "$SEQ" --micro-batch-sizes 1,2,4 --gpu-name H200 --out "$OUT/profile.csv"
if [[ $DRY == 1 ]]; then
    echo "(dry run: no shipped H200 rows for $MODEL; comparison skipped)"
else
    "$PY" bench/profile_vs_shipped.py "$OUT/profile.csv" | tee "$OUT/profile_vs_shipped.md"
fi

# --- summary -----------------------------------------------------------------------------------
{
    echo "# gpu_check $(date -u +%FT%TZ) (dry run: $DRY)"
    "$PY" -c "import torch; print('device:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu', '| torch', torch.__version__)"
    echo '```'
    cat "$WORK/plain.log"
    "$PY" - "$OUT/run.jsonl" <<'PYCODE'
import sys
from hetpp.runtime.metrics import load_records
for r in load_records(sys.argv[1], "memory"):
    print(f"memory rank {r['rank']}: predicted {r['predicted_bytes'] / 1e6:.1f} MB, measured "
          f"{r['measured_bytes'] / 1e6:.1f} MB ({r['error']:+.1%}, {r['method']})")
PYCODE
    echo '```'
    if [[ -f "$OUT/profile_vs_shipped.md" ]]; then cat "$OUT/profile_vs_shipped.md"; fi
} >"$OUT/summary.md"
cat "$OUT/summary.md"
echo "gpu_check: done, $OUT"
