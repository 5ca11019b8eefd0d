#!/usr/bin/env bash
# The per-task headline of issue 70 with AR interleaved: the leading methods on task=code_edit and task=agent_loop,
# three runs each at T = 0.7 and T = 0, every question decoded by AR right before the method in the same process
# (baseline=interleave), the embedded SmolLM2-135M in float32, compiled, 512 new tokens, every token checked.
# results/cpu-tasks holds every method once against a shared AR; on this CPU one pass of all twelve methods over both
# tasks takes about four hours at each temperature, so the three interleaved runs go to the methods that contend for
# the lead there (Suffix Decoding and TR's family).
#
#   bash scripts/task_headline.sh                       # OUT=results/cpu-tasks-interleaved, REPEATS="1 2 3"
#   REPEATS=2 METHODS="pld" bash scripts/task_headline.sh
#   TASKS=code_edit CURVE=auto OUT=R0 bash scripts/task_headline.sh   # one task; each run measures its own curve
#
# Repeat by repeat, T = 0.7 first, the methods' order reversed on every other repeat. A killed sweep resumes on rerun
# (a finished run directory is skipped, a half-finished one resumes).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/cpu-tasks-interleaved}
CURVE=${CURVE:-results/cpu-tasks/cost_curve.json}   # the curve results/cpu-tasks chose its trees from
REPEATS=${REPEATS:-1 2 3}
TEMPERATURES=${TEMPERATURES:-0.7,0}
# one method per line: its name and settings as run.py takes them
METHODS=${METHODS:-"suffix
tr_fused method.retrieval=suffix method.calibrate=true method.suffix_rates=true"}
CODE_EDIT="task=code_edit task.per_subtask=2"    # each edit kind's first `function` and first `file` prompt
AGENT_LOOP="task=agent_loop task.per_subtask=1"  # one session of each kind, all on one module
TASKS=${TASKS:-code_edit agent_loop}
tasks=()
for t in $TASKS; do
  case $t in
    code_edit) tasks+=("$CODE_EDIT") ;;
    agent_loop) tasks+=("$AGENT_LOOP") ;;
    *) echo "error: TASKS takes code_edit and agent_loop, got '$t'" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"

mapfile -t methods <<<"$METHODS"
for r in $REPEATS; do
  order=("${methods[@]}")
  if (( r % 2 == 0 )); then order=(); for ((i=${#methods[@]}-1; i>=0; i--)); do order+=("${methods[i]}"); done; fi
  for task in "${tasks[@]}"; do
    for m in "${order[@]}"; do
      # shellcheck disable=SC2086  # a method line and a task are several settings each
      python run.py -m method=$m $task temperature="$TEMPERATURES" repeat="$r" cost_curve="$CURVE" \
        baseline=interleave compile=on progress=false results_root="$OUT"
    done
  done
done
python scripts/make_tables.py "$OUT"
