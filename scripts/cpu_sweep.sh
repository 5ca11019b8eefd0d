#!/usr/bin/env bash
# The CPU sweeps behind results/cpu (eager) and results/archive/cpu-packed (compiled, made as results/cpu-packed): every registered method on Spec-Bench
# (first 2 questions per subtask, 128 new tokens) with the embedded SmolLM2-135M on this machine's
# CPU, greedy, 3 repeats (Spec-Bench reports the mean of 3), AR interleaved question by question
# beside every method (the drift-fair mode), warm-up on the built-in prompt with every drafter reset
# afterwards (warmup_on=builtin). Then TR once more with Spec-Bench's warm-up on the first question
# (warmup_on=first_question), to show what that protocol adds to hot-start TR.
#
#   bash scripts/cpu_sweep.sh        # QUESTIONS=/path/to/question.jsonl, TEMPERATURES=0,0.7,1.0, REPEATS=1,2,3
#   COMPILE=on OUT=results/cpu-packed REPEATS=0 FIRST_QUESTION=no BASELINE=shared bash scripts/cpu_sweep.sh   # compiled forward
#
# 1. profiles the cost curve t(w), w = 1..81 (cached, so every run's speedup bound and adaptive TR
#    use the same curve); 2. one Hydra multirun over repeat x temperature x method (a killed sweep
#    resumes: rerun the same command, finished questions are skipped); 3. tables (mean +- std over
#    the repeats), plots and the executed notebook from the results directory.
set -euo pipefail
cd "$(dirname "$0")/.."
QUESTIONS=${QUESTIONS:-${SPECBENCH_QUESTIONS:-../shared/data/spec_bench/question.jsonl}}
OUT=${OUT:-results/cpu}
METHODS=${METHODS:-tr,tr_adaptive,tr_fused,pld,lookahead,rest,medusa}
TEMPERATURES=${TEMPERATURES:-0}
REPEATS=${REPEATS:-1,2,3}
BASELINE=${BASELINE:-interleave}
COMPILE=${COMPILE:-off}   # the tables in results/cpu are eager; results/archive/cpu-packed's: COMPILE=on
FIRST_QUESTION=${FIRST_QUESTION:-yes}
mkdir -p "$OUT"

PROFILE=()
[ "$COMPILE" = on ] && PROFILE=(--compile)
[ -f "$OUT/cost_curve.json" ] || python scripts/profile_cost.py "${PROFILE[@]}" --out "$OUT/cost_curve.json"

COMMON=(task=spec_bench task.path="$QUESTIONS" task.per_subtask=2 max_new_tokens=128 results_root="$OUT"
        cost_curve="$OUT/cost_curve.json" baseline="$BASELINE" compile="$COMPILE")
# one process per multirun: the model loads and the forward compiles once for all its jobs
python run.py -m repeat="$REPEATS" temperature="$TEMPERATURES" method="$METHODS" "${COMMON[@]}"
if [ "$FIRST_QUESTION" = yes ]; then
  python run.py -m repeat="$REPEATS" temperature="$TEMPERATURES" method=tr warmup_on=first_question "${COMMON[@]}"
fi

python scripts/make_tables.py "$OUT"   # writes tables.md, .tex, .csv and results.csv
python scripts/plot.py "$OUT" --out "$OUT/plots"
python scripts/run_notebook.py notebooks/results.ipynb --results "$OUT" --out "$OUT/results.ipynb"
