#!/usr/bin/env bash
# The GPU sweep: the cost curve, then AR, TR (static and adaptive), PLD, Lookahead, REST and Medusa
# on Spec-Bench (first 5 questions per subtask) with the embedded SmolLM2-135M, into results/gpu/.
#
#   bash scripts/gpu_sweep.sh                         # needs Spec-Bench's question.jsonl, see QUESTIONS
#   QUESTIONS=/data/question.jsonl DTYPE=bfloat16 PER_SUBTASK=5 bash scripts/gpu_sweep.sh
#
# Settings (environment): QUESTIONS (Spec-Bench question.jsonl; default $SPECBENCH_QUESTIONS, else
# ../shared/data/spec_bench/question.jsonl), DTYPE (float16), PER_SUBTASK (5), MAX_NEW (1024, as
# Spec-Bench), OUT (results/gpu), BASELINE (shared: AR runs once and every method reuses its answers;
# interleave: AR right before each method on every question, fairer against drift, twice the time),
# METHODS (the list below), MODEL (smollm2-135m).
#
# Writes OUT/cost_curve.json (t(w), w = 1..128, also cached where runs look for it, so every summary's
# speedup bound uses it), one directory per method under OUT/<model>/spec_bench-ps<N>/, the sweep's
# OUT/results.csv and OUT/tables.md. Each run exits non-zero on a real lossless mismatch; the sweep
# carries on and reports the failures at the end.
set -uo pipefail
cd "$(dirname "$0")/.."

QUESTIONS=${QUESTIONS:-${SPECBENCH_QUESTIONS:-../shared/data/spec_bench/question.jsonl}}
DTYPE=${DTYPE:-float16}
PER_SUBTASK=${PER_SUBTASK:-5}
MAX_NEW=${MAX_NEW:-1024}
OUT=${OUT:-results/gpu}
BASELINE=${BASELINE:-shared}
MODEL=${MODEL:-smollm2-135m}
METHODS=${METHODS:-"ar tr tr_adaptive pld lookahead rest medusa"}

if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_sweep: no CUDA device visible to torch" >&2
  exit 2
fi
if [ ! -f "$QUESTIONS" ]; then
  echo "gpu_sweep: Spec-Bench questions not found at '$QUESTIONS'; set QUESTIONS=/path/to/question.jsonl" >&2
  exit 2
fi
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1 || true

echo "== cost curve ($MODEL, cuda, $DTYPE)"
python scripts/profile_cost.py --model "$MODEL" --device cuda --dtype "$DTYPE" --max-width 128 \
  --repeats 15 --warmup 5 --out "$OUT/cost_curve.json" || exit 1

failed=()
for m in $METHODS; do
  if ! python -c "import sys; from specbench.registry import available_methods; sys.exit('$m' not in available_methods())"; then
    echo "== $m: not registered in this checkout, skipped"
    failed+=("$m(missing)")
    continue
  fi
  echo "== $m"
  python run.py method="$m" model="$MODEL" task=spec_bench task.path="$QUESTIONS" task.per_subtask="$PER_SUBTASK" \
    max_new_tokens="$MAX_NEW" device=cuda dtype="$DTYPE" baseline="$BASELINE" results_root="$OUT" \
    cost_curve="$OUT/cost_curve.json" wandb.enabled=false progress=false || failed+=("$m")
done

python scripts/make_tables.py "$OUT" --out "$OUT" --published "" || failed+=("tables")
cat "$OUT/tables.md"
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_sweep: failed or skipped: ${failed[*]}" >&2
  exit 1
fi
