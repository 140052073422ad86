#!/usr/bin/env bash
# The runtime's CUDA path on a fresh single-GPU machine, unattended, in about 8 minutes at most
# (docs/benchmarks-runtime.md has what it measured on an H200).
#
#   bash bench/gpu_check.sh [--dry-run] [OUT_DIR]      # from the repository root
#
# OUT_DIR defaults to $OUT when set, else ./gpu-check. It receives eight files: summary.md (the
# figures, the comparisons and each step's status), steps.md (written as steps end),
# gpu_check.log (everything printed), plan.json, run.jsonl (hetpp's metrics and memory
# records), profile.csv, profile_llama.csv and profile_fp32.csv. Set-up needs no network:
#   - Python: $PY if set; else .venv/bin/python if its torch sees a GPU; else the machine's
#     python3 (a CUDA build of torch in its site-packages), with src/ on PYTHONPATH.
#   - Python packages it lacks (pydantic on a bare CUDA image, say) are installed from wheels in
#     $WHEELS (default .whl/, ignored by git; for pydantic: pydantic, pydantic-core,
#     annotated-types, typing-inspection) into a temporary folder, offline; anything still missing
#     stops the check naming it.
# Steps, each under a time limit (`timeout`); a step that fails is reported and the next one runs
# (a lent GPU is minutes long: one run should say everything), and the check exits 1 at the end:
#   1. the CUDA tests (tests/gpu);
#   2. a one-rank bf16 training of gpt3-1.3b (~1.3B parameters), 20 steps, with --memory-report,
#      in the planner's own plan for it (1F1B on one device), beside a plain PyTorch loop of the
#      same model and precision (tokens/s, MFU, hetpp / plain);
#   3. `hetpp profile --device cuda` of gpt3-1.3b's layers (bf16) beside the shipped H200 rows
#      and beside the estimator's prediction (the padded LM head is new evidence), and
#      llama2-7b's layers (a vocabulary already aligned to 128) beside the estimator;
#   4. the same in fp32 at micro-batch 1, without --gpu-name (the default must name the device's
#      catalog type), beside the estimator's fp32 prediction (TF32 off);
#   5. the FSDP plan of the same job trained (fully_shard on one rank), its step time.
# ONLY=REGEX runs the steps whose name starts with it (ONLY=2: step 2 alone, to rerun it).
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
# Wheels only for what $PY lacks: a wheel built for another Python must not stop a machine that
# needs none of them.
if ! "$PY" -c 'import pydantic' 2>/dev/null && compgen -G "$WHEELS/*.whl" >/dev/null; then
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
    DEVICE=cpu MODEL=tiny-gpt LLAMA=tiny-llama SEQ=128 STEPS=2 BATCH=4 MBS=2 LIMIT=3
else
    DEVICE=cuda MODEL=gpt3-1.3b LLAMA=llama2-7b SEQ=2048 STEPS=20 BATCH=16 MBS=4 LIMIT=1
    "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
fi
# A step's time limit in seconds: $1 on the GPU (the sum stays under 8 minutes), LIMIT times that
# in a dry run on a shared CPU.
limit() { echo $(($1 * LIMIT)); }

# Each step: its name, its time limit on the GPU, its command (a program or one of the functions
# below, run by a child bash: `timeout` runs programs only). Its status goes to $OUT/steps.md at
# once, so a run cut short still says how far it got.
FAILED=()
export PY OUT WORK STEPS DEVICE
step() {
    local name=$1 secs=$2
    shift 2
    if [[ -n "${ONLY:-}" && ! "$name" =~ ^$ONLY ]]; then return; fi
    echo "== $name"
    if timeout "$(limit "$secs")" bash -c '"$@"' _ "$@"; then
        echo "- $name: passed" >>"$OUT/steps.md"
    else
        echo "- $name: FAILED (exit $?)" >>"$OUT/steps.md"
        FAILED+=("$name")
    fi
}
: >"$OUT/steps.md"

# --- 1. CUDA tests -----------------------------------------------------------------------------
if [[ $DRY == 1 ]]; then
    step "1. CUDA tests (dry run: collected only)" 60 "$PY" -m pytest -q --collect-only -m gpu tests/gpu
else
    step "1. CUDA tests" 90 "$PY" -m pytest -q -m gpu tests/gpu
fi

# --- 2. one-rank bf16 training vs a plain loop ------------------------------------------------
cat >"$WORK/one-h200.yaml" <<YAML
name: one-h200
nodes:
  - {gpu: H200, gpus_per_node: 1, intra_node_GBps: 450}
inter_node_GBps: 25
YAML
# The job's plan on one H200 (gpt3-1.3b bf16, no recomputation): the plan file, then options.
plan_job() {
    local out=$1
    shift
    "$PY" -m hetpp.cli.main plan --cluster "$WORK/one-h200.yaml" --model "$MODEL" \
        --global-batch "$BATCH" --seq-len "$SEQ" --precision bf16 --micro-batch-sizes "$MBS" \
        --recompute off --out "$out" "$@"
}
export -f plan_job
export MODEL BATCH SEQ MBS
# --strategy hpp: the pipelining runtime is what this checks (on one device `best` picks FSDP,
# whose optimizer step the cost model prices 1% cheaper; step 5 trains that one).
step "2a. hetpp plan (one H200, $MODEL, bf16, hpp)" 60 plan_job "$OUT/plan.json" --strategy hpp
step "2b. hetpp train, $STEPS steps" 150 "$PY" -m hetpp.cli.main train --plan "$OUT/plan.json" \
    --steps "$STEPS" --metrics "$OUT/run.jsonl" --memory-report --lr 1e-4
plain() {
    set -o pipefail
    "$PY" bench/plain_loop.py --plan "$OUT/plan.json" --steps "$STEPS" --device "$DEVICE" \
        --hetpp-metrics "$OUT/run.jsonl" | tee "$WORK/plain.log"
}
export -f plain
step "2c. plain PyTorch loop, same model and precision" 80 plain

# --- 3. bf16 profile beside the shipped H200 rows and the estimator ----------------------------
step "3a. hetpp profile --device $DEVICE (bf16)" 80 "$PY" -m hetpp.cli.main profile \
    --model "$MODEL" --device "$DEVICE" --seq-len "$SEQ" --micro-batch-sizes 1,2,4 \
    --gpu-name H200 --dtype bfloat16 --out "$OUT/profile.csv"
if [[ $DRY == 0 ]]; then
    shipped() { "$PY" bench/profile_vs_shipped.py "$OUT/profile.csv" >"$WORK/profile_vs_shipped.md"; }
    export -f shipped
    step "3b. bf16 profile vs the shipped H200 rows" 30 shipped
fi
estimate() {
    "$PY" bench/profile_vs_estimate.py "$1" --dtype "$2" >>"$WORK/profile_vs_estimate.md"
}
export -f estimate
step "3c. bf16 profile vs the estimator" 30 estimate "$OUT/profile.csv" bf16
step "3d. hetpp profile --device $DEVICE of $LLAMA (bf16; an aligned vocabulary)" 60 \
    "$PY" -m hetpp.cli.main profile --model "$LLAMA" --device "$DEVICE" --seq-len "$SEQ" \
    --micro-batch-sizes 1,2 --gpu-name H200 --dtype bfloat16 --out "$OUT/profile_llama.csv"
step "3e. $LLAMA profile vs the estimator" 30 estimate "$OUT/profile_llama.csv" bf16

# --- 4. fp32 profile, default GPU name, beside the estimator -----------------------------------
step "4a. hetpp profile --device $DEVICE (fp32, mbs 1, default --gpu-name)" 60 \
    "$PY" -m hetpp.cli.main profile --model "$MODEL" --device "$DEVICE" --seq-len "$SEQ" \
    --micro-batch-sizes 1 --dtype float32 --repeats 3 --out "$OUT/profile_fp32.csv"
if [[ $DRY == 1 ]]; then
    echo "(dry run: fp32 rows are named CPU, which the estimator has no type for)"
else
    step "4b. fp32 profile vs the estimator" 30 estimate "$OUT/profile_fp32.csv" fp32
fi

# --- 5. the FSDP plan of the same job (fully_shard on one rank) -------------------------------
step "5a. hetpp plan --strategy fsdp" 60 plan_job "$WORK/plan_fsdp.json" --strategy fsdp
step "5b. hetpp train (FSDP), $STEPS steps" 90 "$PY" -m hetpp.cli.main train \
    --plan "$WORK/plan_fsdp.json" --steps "$STEPS" --metrics "$WORK/run_fsdp.jsonl" --lr 1e-4

# --- summary -----------------------------------------------------------------------------------
{
    echo "# gpu_check $(date -u +%FT%TZ) (dry run: $DRY)"
    "$PY" -c "import torch; print('device:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu', '| torch', torch.__version__)"
    cat "$OUT/steps.md"
    echo '```'
    cat "$WORK/plain.log" 2>/dev/null || true
    "$PY" - "$OUT/plan.json" "$OUT/run.jsonl" "$WORK/run_fsdp.jsonl" <<'PYCODE' || true
import sys
from pathlib import Path
from hetpp.runtime.metrics import load_metrics, load_records, summarize
from hetpp.specs.plan import load_plan
plan = load_plan(sys.argv[1])
measured = summarize(load_metrics(sys.argv[2]))["step_time_s"]
print(f"step: predicted {plan.estimate.iteration_time_s:.4f} s, measured {measured:.4f} s "
      f"({measured / plan.estimate.iteration_time_s - 1:+.1%})")
fsdp = Path(sys.argv[3])
if fsdp.exists():
    step_s = summarize(load_metrics(fsdp))["step_time_s"]
    predicted = load_plan(fsdp.with_name("plan_fsdp.json")).estimate.iteration_time_s
    print(f"FSDP plan: predicted {predicted:.4f} s, measured {step_s:.4f} s")
for r in load_records(sys.argv[2], "memory"):
    print(f"memory rank {r['rank']}: predicted {r['predicted_bytes'] / 1e6:.1f} MB, measured "
          f"{r['measured_bytes'] / 1e6:.1f} MB ({r['error']:+.1%}, {r['method']})")
PYCODE
    echo '```'
    { cut -d, -f1 "$OUT/profile_fp32.csv" | sort -u | grep -v '^gpu$' | sed 's/^/fp32 rows named: /'; } 2>/dev/null || true
    for f in profile_vs_shipped.md profile_vs_estimate.md; do
        if [[ -f "$WORK/$f" ]]; then echo; echo "## $f"; cat "$WORK/$f"; fi
    done
} >"$OUT/summary.md"
cat "$OUT/summary.md"
if ((${#FAILED[@]})); then
    echo "gpu_check: ${#FAILED[@]} step(s) failed: ${FAILED[*]}"
    exit 1
fi
echo "gpu_check: done, $OUT"
