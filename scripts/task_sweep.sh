#!/usr/bin/env bash
# The per-task sweep behind results/cpu-tasks (issue 70): the methods on task=code_edit and task=agent_loop, the
# embedded SmolLM2-135M in float32 on this machine's CPU, compiled, 512 new tokens, every output checked against
# AR's. AR is decoded once per question and temperature and shared by the sweep (baseline=shared: on these tasks
# one AR pass costs minutes, and interleaving it for every method would double the sweep). Spec-Bench's figures for
# the same table come from results/cpu-headline-v3 (every method, three runs at each temperature, AR interleaved).
#
#   bash scripts/task_sweep.sh            # OUT=results/cpu-tasks; the phases below, in order
#   PHASES="1 2" bash scripts/task_sweep.sh
#
# 1. the leaders at T = 0, with tr_fused's retrieval ablations (suffix trees; the same with its estimates calibrated;
#    suffix trees kept across requests);
# 2. the leaders at T = 0.7;  3. every other method at T = 0;  4. and 5. the leaders' second and third runs at both
# temperatures. A killed sweep resumes on rerun (a finished run directory is skipped, a half-finished one resumes).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/cpu-tasks}
LEADERS=${LEADERS:-tr_fused,suffix,pld,tr_adaptive}
OTHERS=${OTHERS:-tr,samd,lookahead,rest,sps,medusa,eagle}
PHASES=${PHASES:-1 2 3 4 5}
CODE_EDIT=(task=code_edit task.per_subtask=2)    # each edit kind's first `function` and first `file` prompt
AGENT_LOOP=(task=agent_loop task.per_subtask=1)  # one session of each kind, all on one module
mkdir -p "$OUT"

# t(w) at the contexts these tasks reach (prompts up to 2,000 tokens, sessions up to about 4,000)
[ -f "$OUT/cost_curve.json" ] || python scripts/profile_cost.py --compile \
  --widths 1,2,4,8,16,32,48,64,81 --contexts 1024,2048,4096 --repeats 3 --out "$OUT/cost_curve.json"

sweep() {  # methods temperature repeat [extra settings]
  local methods=$1 t=$2 r=$3; shift 3
  for task in CODE_EDIT AGENT_LOOP; do
    local -n settings=$task
    python run.py -m method="$methods" "${settings[@]}" temperature="$t" repeat="$r" "$@" \
      cost_curve="$OUT/cost_curve.json" baseline=shared compile=on progress=false results_root="$OUT"
  done
}

leaders() {  # temperature repeat
  sweep "$LEADERS" "$1" "$2"
  sweep tr_fused "$1" "$2" method.retrieval=suffix
  # its estimates calibrated: on code_edit the uncalibrated ones promise 1.1-1.5x what is accepted
  sweep tr_fused "$1" "$2" method.retrieval=suffix method.calibrate=true method.suffix_rates=true
}

for phase in $PHASES; do
  case $phase in
    1) leaders 0 1; sweep tr_fused 0 1 method.retrieval=suffix method.suffix_global=true ;;
    2) leaders 0.7 1 ;;
    3) sweep "$OTHERS" 0 1 ;;
    4|5) leaders 0 $((phase - 2)); leaders 0.7 $((phase - 2)) ;;
  esac
done

python scripts/make_tables.py "$OUT"
