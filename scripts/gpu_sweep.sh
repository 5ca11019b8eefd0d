#!/usr/bin/env bash
# The full GPU sweep, for a GPU machine with the project installed and time to spare (an offline node
# with a short slot: scripts/gpu_check.py, docs/gpu.md): the cost curve, then every registered method on Spec-Bench (first 5 questions per
# subtask) with the largest embedded model (Gemma-3-270M; MODEL= any model config, e.g. vicuna-7b),
# in float16, on the eager forward and then on the compiled one (CUDA graphs), into results/gpu/.
#
#   bash scripts/gpu_sweep.sh                         # needs Spec-Bench's question.jsonl, see QUESTIONS
#   QUESTIONS=/data/question.jsonl DTYPE=bfloat16 PER_SUBTASK=5 bash scripts/gpu_sweep.sh
#
# Settings (environment): QUESTIONS (Spec-Bench question.jsonl; default $SPECBENCH_QUESTIONS, else
# ../shared/data/spec_bench/question.jsonl), DTYPE (float16), PER_SUBTASK (5), MAX_NEW (1024, as
# Spec-Bench), OUT (results/gpu), BASELINE (shared: AR runs once and every method reuses its answers;
# interleave: AR right before each method on every question, fairer against drift, twice the time),
# METHODS (every registered method), MODEL (gemma3-270m: the largest model that ships with us; pass
# the largest your GPU holds), COMPILE ("off on": each method eager, then compiled), DRY_RUN (1: print
# the commands instead of running them; no GPU needed).
#
# Writes OUT/cost_curve.json (t(w), w = 1..128, also cached where runs look for it, so every summary's
# speedup bound uses it), one directory per method under OUT/<model>/spec_bench-ps<N>/, the sweep's
# OUT/results.csv and OUT/tables.md (compiled runs under OUT/compiled/). Each run exits non-zero on a real lossless mismatch; the sweep
# carries on and reports the failures at the end.
set -uo pipefail
cd "$(dirname "$0")/.."

QUESTIONS=${QUESTIONS:-${SPECBENCH_QUESTIONS:-../shared/data/spec_bench/question.jsonl}}
DTYPE=${DTYPE:-float16}
PER_SUBTASK=${PER_SUBTASK:-5}
MAX_NEW=${MAX_NEW:-1024}
OUT=${OUT:-results/gpu}
BASELINE=${BASELINE:-shared}
MODEL=${MODEL:-gemma3-270m}
AVAILABLE=$(python -c "from specbench.registry import available_methods; print(' '.join(available_methods()))")
METHODS=${METHODS:-$AVAILABLE}
COMPILE=${COMPILE:-"off on"}

run() { if [ "${DRY_RUN:-0}" = 1 ]; then echo "+ $*"; else "$@"; fi; }

if [ "${DRY_RUN:-0}" != 1 ] && ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_sweep: no CUDA device visible to torch" >&2
  exit 2
fi
if [ ! -f "$QUESTIONS" ]; then
  echo "gpu_sweep: Spec-Bench questions not found at '$QUESTIONS'; set QUESTIONS=/path/to/question.jsonl" >&2
  exit 2
fi
run mkdir -p "$OUT"
[ "${DRY_RUN:-0}" = 1 ] || nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1 || true

failed=()
for compile in $COMPILE; do
  out="$OUT"; [ "$compile" = on ] && out="$OUT/compiled"
  run mkdir -p "$out"
  echo "== cost curve ($MODEL, cuda, $DTYPE, compile=$compile)"
  flag=""; [ "$compile" = on ] && flag="--compile"
  run python scripts/profile_cost.py --model "$MODEL" --device cuda --dtype "$DTYPE" --max-width 128 \
    --repeats 15 --warmup 5 $flag --out "$out/cost_curve.json" || failed+=("cost_curve:$compile")
  # without a profiled curve (or one whose compiled forward fell back) each run measures a quick one
  curve="$out/cost_curve.json"; [ -f "$curve" ] || [ "${DRY_RUN:-0}" = 1 ] || curve=auto
  for m in $METHODS; do
    if [[ " $AVAILABLE " != *" $m "* ]]; then
      echo "== $m: not registered in this checkout, skipped"
      failed+=("$m(missing)")
      continue
    fi
    echo "== $m (compile=$compile)"
    run python run.py method="$m" model="$MODEL" task=spec_bench task.path="$QUESTIONS" task.per_subtask="$PER_SUBTASK" \
      max_new_tokens="$MAX_NEW" device=cuda dtype="$DTYPE" compile="$compile" baseline="$BASELINE" \
      results_root="$out" cost_curve="$curve" wandb.enabled=false progress=false \
      || failed+=("$m:$compile")
  done
  run python scripts/make_tables.py "$out" --out "$out" --published "" || failed+=("tables:$compile")
  run cat "$out/tables.md"
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_sweep: failed or skipped: ${failed[*]}" >&2
  exit 1
fi
