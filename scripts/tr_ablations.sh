#!/usr/bin/env bash
# Token Recycling ablations on Spec-Bench (first 2 questions per subtask, 128 new tokens, greedy),
# AR interleaved beside every run, one table: what each design choice of TR buys on this machine.
#
#   bash scripts/tr_ablations.sh          # OUT=results/tr_ablations QUESTIONS=... REPEATS=1
#   COMPILE=on OUT=results/cpu-packed CURVE=results/cpu-packed/cost_curve.json \
#     TREE=data/trees/smollm2-135m-cpu-compiled.json bash scripts/tr_ablations.sh   # compiled forward
#
# 1. the cost curve (shared with the CPU sweep when it exists);
# 2. a calibration run of TR with the published tree on prompts in no benchmark task
#    (data/trees/calibration_questions.jsonl) and the template tuned from it (scripts/tune_tree.py);
# 3. the grid, one factor at a time around the paper's TR (update=all_rows, no prefill update,
#    k=8, hot start, published tree): update rule x prefill update; k = 2, 4 (the published tree
#    trimmed to k children per node, data/trees/published-k*.json); cold start; the tuned tree;
# 4. tables (the ablation table follows the leaderboard) and plots (per-node acceptance).
set -euo pipefail
cd "$(dirname "$0")/.."
QUESTIONS=${QUESTIONS:-${SPECBENCH_QUESTIONS:-../shared/data/spec_bench/question.jsonl}}
OUT=${OUT:-results/tr_ablations}
REPEATS=${REPEATS:-1}
CURVE=${CURVE:-results/tr_calibration/cost_curve.json}  # the eager curve of results/cpu (commit b392894), the same file
TREE=${TREE:-$OUT/tuned_tree.json}
CALIBRATION=${CALIBRATION:-results/tr_calibration}
COMPILE=${COMPILE:-off}
mkdir -p "$OUT"

PROFILE=()
[ "$COMPILE" = on ] && PROFILE=(--compile)
[ -f "$CURVE" ] || python scripts/profile_cost.py "${PROFILE[@]}" --out "$CURVE"

if [ ! -f "$TREE" ]; then
  python run.py method=tr task=jsonl task.path=data/trees/calibration_questions.jsonl max_new_tokens=128 \
      baseline=none cost_curve="$CURVE" results_dir="$CALIBRATION" wandb.enabled=false compile="$COMPILE"
  # the calibration ran alone, so its own timings estimate the per-step overhead
  python scripts/tune_tree.py "$CALIBRATION" --cost-curve "$CURVE" --out "$TREE"
fi

COMMON=(task=spec_bench task.path="$QUESTIONS" task.per_subtask=2 max_new_tokens=128 results_root="$OUT"
        cost_curve="$CURVE" baseline=interleave temperature=0 method=tr compile="$COMPILE")
python run.py -m repeat="$REPEATS" method.update=all_rows,accepted method.prefill_update=false,true "${COMMON[@]}"
for k in 2 4; do
  python run.py -m repeat="$REPEATS" method.k=$k method.tree=data/trees/published-k$k.json "${COMMON[@]}"
done
python run.py -m repeat="$REPEATS" method.cold_start=true "${COMMON[@]}"
python run.py -m repeat="$REPEATS" method.tree="$TREE" "${COMMON[@]}"

python scripts/make_tables.py "$OUT"
python scripts/plot.py "$OUT" --out "$OUT/plots"
