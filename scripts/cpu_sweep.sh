#!/usr/bin/env bash
# The sweep behind the README's results and results/cpu/: every registered method at temperature
# 0, 0.7 and 1.0 on Spec-Bench (first 2 questions per subtask, 128 new tokens) with the embedded
# SmolLM2-135M on this machine's CPU. AR runs once per temperature and every method's speedup is
# taken against it (baseline=shared); BASELINE=interleave reruns AR beside each method instead
# (fairer against machine drift, twice the time).
#
#   bash scripts/cpu_sweep.sh                      # QUESTIONS=/path/to/question.jsonl to point elsewhere
#
# 1. profiles the cost curve t(w), w = 1..81 (cached, so every run's speedup bound and adaptive TR
#    use the same curve); 2. one Hydra multirun over temperature x method (a killed sweep resumes:
#    rerun the same command, finished questions are skipped); 3. tables, plots and the executed
#    notebook from the results directory.
set -euo pipefail
cd "$(dirname "$0")/.."
QUESTIONS=${QUESTIONS:-${SPECBENCH_QUESTIONS:-../shared/data/spec_bench/question.jsonl}}
OUT=${OUT:-results/cpu}
METHODS=${METHODS:-ar,tr,tr_adaptive,pld,lookahead,rest,medusa}
TEMPERATURES=${TEMPERATURES:-0,0.7,1.0}
BASELINE=${BASELINE:-shared}
mkdir -p "$OUT"

[ -f "$OUT/cost_curve.json" ] || python scripts/profile_cost.py --out "$OUT/cost_curve.json"

python run.py -m temperature="$TEMPERATURES" method="$METHODS" task=spec_bench task.path="$QUESTIONS" \
  task.per_subtask=2 max_new_tokens=128 results_root="$OUT" cost_curve="$OUT/cost_curve.json" baseline="$BASELINE"

python scripts/make_tables.py "$OUT"   # writes tables.md, .tex, .csv and results.csv
python scripts/plot.py "$OUT" --out "$OUT/plots"
python scripts/run_notebook.py notebooks/results.ipynb --results "$OUT" --out "$OUT/results.ipynb"
