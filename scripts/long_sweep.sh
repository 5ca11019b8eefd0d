#!/usr/bin/env bash
# The long-input sweep behind results/cpu-long-all and results/archive/cpu-long (made as results/cpu-long): every registered method on task=long (input-length
# buckets of 1k, 2k, 4k and 8k tokens, data/long/README.md), the embedded SmolLM2-135M in float32 on
# this machine's CPU, greedy, 64 new tokens, every output checked against AR's.
#
#   bash scripts/long_sweep.sh        # PER_SUBTASK=2 (one prose, one code prompt per bucket; null: all 6)
#                                     # COMPILE=off, BASELINE=shared, METHODS=..., OUT=results/cpu-long
#   MODEL=gemma3-270m TASK_PATH=data/long-gemma3/long.jsonl CONTEXTS=16000,32000 PER_SUBTASK=1 \
#     OUT=results/cpu-long-gemma3 bash scripts/long_sweep.sh      # Gemma-3's 16k and 32k buckets
#     (not run on the 2-core CPU: one 32k prefill there takes over 10 minutes; see docs/results-log.md)
#
# 1. profiles t(w) at the contexts the task meets (cached: every run's bound and the goodput choices of
#    tr_adaptive and tr_fused read the curve at the step's own context); 2. one Hydra multirun over the
#    methods (BASELINE=shared: AR decoded once per question, under a lock, its answers and times shared by
#    the sweep; a killed sweep resumes on rerun); 3. tables and plots, speedup against input length.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/cpu-long}
METHODS=${METHODS:-tr,tr_adaptive,tr_fused,pld,lookahead,rest,medusa,eagle,sps,samd,suffix}
PER_SUBTASK=${PER_SUBTASK:-2}
BASELINE=${BASELINE:-shared}
COMPILE=${COMPILE:-off}
MODEL=${MODEL:-smollm2-135m}
TASK_PATH=${TASK_PATH:-null}  # null: data/long
CONTEXTS=${CONTEXTS:-1024,2048,4096,7600}  # where t(w, L) is timed besides 400: the task's prompt lengths
mkdir -p "$OUT"

PROFILE=()
[ "$COMPILE" = on ] && PROFILE=(--compile)
[ -f "$OUT/cost_curve.json" ] || python scripts/profile_cost.py --model "$MODEL" "${PROFILE[@]}" \
  --widths 1,2,4,8,16,32,48,64,81 --contexts "$CONTEXTS" --repeats 3 --out "$OUT/cost_curve.json"

python run.py -m method="$METHODS" model="$MODEL" task=long task.path="$TASK_PATH" task.per_subtask="$PER_SUBTASK" max_new_tokens=64 \
  results_root="$OUT" cost_curve="$OUT/cost_curve.json" baseline="$BASELINE" compile="$COMPILE" progress=false

python scripts/make_tables.py "$OUT"
python scripts/plot.py "$OUT" --out "$OUT/plots"
