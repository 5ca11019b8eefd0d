#!/usr/bin/env bash
# Issue 70's headline sweep: every method, and TR's family with its ablations, on spec_bench, code_edit and
# agent_loop at T = 0 and T = 0.7, three repeats, AR decoded right before the method on every question
# (baseline=interleave), the embedded SmolLM2-135M in float32, compiled, every token checked, each run pricing
# its trees on the day's quick curve (cost_curve=auto, the default).
#
# On this 2-core CPU the whole sweep is about two days of compute, more than a session holds, so it runs in
# blocks: a block is one task at one temperature in one repeat, for one group of methods:
#   lead: the methods that contend for a column's lead (TR's family with its ablations, Suffix Decoding, PLD,
#         SAM-Decoding), so a column's contenders always meet one machine in a block;
#   rest: the methods that trail far behind (TR, Lookahead, REST, SpS, Medusa, EAGLE-2).
# Every run's speedup is against its own interleaved AR, so blocks made on different machines each still
# compare a method with AR side by side; the block's record names its machine.
#
#   bash scripts/headline_sweep.sh --list          # every block: packed (where, on which machine), done, partial or to do
#   BLOCKS="code_edit:0:1:lead spec_bench:0.7:1:lead" bash scripts/headline_sweep.sh
#   bash scripts/headline_sweep.sh --restore       # every finished block's runs back from git, then the tables
#
# The code is pinned: the sweep folder's `pinned` file holds the tree of specbench/ that every block runs. If
# main's specbench/ has moved on, run the pinned commit's code from a worktree:
#   git worktree add --detach ../sweep <commit in pinned> && CODE=../sweep bash scripts/headline_sweep.sh
# (the script, OUT and the records stay in this checkout). A block is made on one machine: one left half-done on
# another host is refused until its runs are removed. A finished block task:T:r:group is packed as
# blocks/task-tT-rR-group.tar.xz, committed once and then removed from main (the checkout leaves room for a GPU
# pack); --restore takes each from the commit that added it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/cpu-headline-tasks}
CODE=$(cd "${CODE:-.}" && pwd)
QUESTIONS=$(realpath "${QUESTIONS:-${SPECBENCH_QUESTIONS:-../shared/data/spec_bench/question.jsonl}}")

# one method per line: its name and settings as run.py takes them
LEAD="tr_fused
tr_fused method.retrieval=suffix
tr_fused method.retrieval=suffix method.calibrate=true method.suffix_rates=true
tr_adaptive
suffix
pld
samd"
REST="tr
lookahead
rest
sps
medusa
eagle"

task_settings() {  # task -> run.py settings
  case $1 in
    spec_bench) echo "task=spec_bench task.path=$QUESTIONS task.per_subtask=2 max_new_tokens=128" ;;
    code_edit) echo "task=code_edit task.per_subtask=2" ;;    # each edit kind's first function and file prompt
    agent_loop) echo "task=agent_loop task.per_subtask=1" ;;  # one session of each kind, all on one module
    *) echo "error: a block's task is spec_bench, code_edit or agent_loop, got '$1'" >&2; exit 2 ;;
  esac
}

group_methods() { if [ "$1" = lead ]; then echo "$LEAD"; else echo "$REST"; fi; }

all_blocks() {  # the canonical order: the leaders' blocks first, repeat by repeat
  for group in lead rest; do for r in 1 2 3; do for t in 0 0.7; do for task in spec_bench code_edit agent_loop; do
    echo "$task:$t:$r:$group"
  done; done; done; done
}

# every block's run directories, as run.py names them, computed once: "block<TAB>method<TAB>directory" lines
block_table() {
  local block task t r group
  while read -r block; do
    IFS=: read -r task t r group <<<"$block"
    group_methods "$group" | while read -r m; do echo "$block|$m|$(task_settings "$task") temperature=$t repeat=$r"; done
  done < <(all_blocks) | PYTHONPATH="$CODE" python -c '
import os, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
import specbench.run.schemas  # noqa: F401  (the typed settings, as run.py registers them)
from specbench.run.plan import checked_settings, run_directory
conf, out = sys.argv[1:]
with initialize_config_dir(config_dir=os.path.abspath(conf), version_base=None):
    for line in sys.stdin.read().splitlines():
        block, method, settings = line.split("|")
        name, *given = method.split()
        cfg = compose("config", overrides=[f"method={name}", *given, *settings.split(), f"results_root={out}"])
        print(f"{block}\t{method}\t{run_directory(checked_settings(OmegaConf.to_container(cfg, resolve=True)))}")
' "$CODE/conf" "$OUT"
}

block_dirs() { awk -F'\t' -v b="$1" '$1 == b { print $3 }' <<<"$BLOCK_TABLE"; }
run_dir() { awk -F'\t' -v b="$1" -v m="$2" '$1 == b && $2 == m { print $3 }' <<<"$BLOCK_TABLE"; }  # block, method

timing_mark() {  # a finished run's directory -> why its timing is not to be trusted (empty: nothing found)
  PYTHONPATH="$CODE" python -c '
import json, sys
from specbench.report.console import timing_line
print(timing_line(json.load(open(sys.argv[1])).get("timing")) or "")' "$1/summary.json"
}

run_method() {  # block, method: one run of the block, as every block runs it
  local task t r group
  IFS=: read -r task t r group <<<"$1"
  # shellcheck disable=SC2046,SC2086  # a method line and a task are several settings each
  PYTHONPATH="$CODE" python "$CODE/run.py" method=$2 $(task_settings "$task") temperature="$t" repeat="$r" \
    baseline=interleave compile=on progress=false results_root="$(realpath "$OUT")"
}

stem() { IFS=: read -r task t r group <<<"$1"; echo "$task-t$t-r$r-$group"; }  # a block's files' name

packed_in() {  # block -> the commit that added its archive (empty if none)
  git log --diff-filter=A --format=%h -1 -- "$OUT/blocks/$(stem "$1").tar.xz" 2>/dev/null || true
}

block_state() {  # block -> done | packed | partial | todo
  local block=$1 finished=0 started=0 n=0 d
  [ -n "$(packed_in "$block")" ] && { echo packed; return; }
  while read -r d; do
    n=$((n + 1))
    [ -f "$d/summary.json" ] && finished=$((finished + 1))
    [ -d "$d" ] && started=$((started + 1))
  done < <(block_dirs "$block")
  if [ "$finished" = "$n" ]; then echo done; elif [ "$started" -gt 0 ]; then echo partial; else echo todo; fi
}

pack() {  # block: its finished runs, with their record, into blocks/<stem>.tar.xz
  local block=$1 dirs
  mapfile -t dirs < <(block_dirs "$block")
  # the answers, settings, summaries and curves; not what they remake (plots) or the run's wandb copy
  tar cJf "$OUT/blocks/$(stem "$block").tar.xz" --exclude=wandb --exclude=plots --exclude=run.lock -C "$OUT" \
    "${dirs[@]#"$OUT"/}" "blocks/$(stem "$block").host"
  echo "$block: packed into $OUT/blocks/$(stem "$block").tar.xz; commit it, then remove it from main"
}

mkdir -p "$OUT/blocks"
tree=$(git -C "$CODE" rev-parse HEAD:specbench)
[ -f "$OUT/pinned" ] || echo "$tree $(git -C "$CODE" rev-parse --short HEAD)" > "$OUT/pinned"
read -r pinned_tree pinned_commit < "$OUT/pinned"
BLOCK_TABLE=$(block_table)

case ${1:-} in
  --list)
    while read -r block; do
      state=$(block_state "$block")
      where=""
      [ "$state" = packed ] && where="in $(packed_in "$block"), made on $(git show "$(packed_in "$block"):$OUT/blocks/$(stem "$block").tar.xz" | tar xJO "blocks/$(stem "$block").host" 2>/dev/null | head -1)"
      printf '%-28s %-8s %s\n' "$block" "$state" "$where"
    done < <(all_blocks)
    exit 0 ;;
  --restore)
    while read -r block; do
      c=$(packed_in "$block")
      [ -n "$c" ] && git show "$c:$OUT/blocks/$(stem "$block").tar.xz" | tar xJ -C "$OUT" && echo "$block: from $c"
    done < <(all_blocks)
    # --allow-mixed: a run still marked after its one rerun stays in the tables, marked † with its reason
    # (the loop below reruns once per block); make_tables.py prints each such run as a warning line
    PYTHONPATH="$CODE" python "$CODE/scripts/make_tables.py" "$OUT" --allow-mixed
    exit 0 ;;
esac

if [ "$tree" != "$pinned_tree" ] || [ -n "$(git -C "$CODE" status --porcelain specbench)" ]; then
  echo "error: $CODE/specbench is not the sweep's pinned code ($OUT/pinned: commit $pinned_commit); run it from a" \
       "clean worktree of that commit: git worktree add --detach ../sweep $pinned_commit, then CODE=../sweep" >&2
  exit 2
fi

BLOCKS=${BLOCKS:-$(all_blocks)}
# the machine as a block records it; the boot's id tells apart machines that share a hostname and a CPU name
host="$(hostname) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores), boot $(cut -c1-8 /proc/sys/kernel/random/boot_id)"
for block in $BLOCKS; do
  IFS=: read -r task t r group <<<"$block"
  task_settings "$task" > /dev/null  # a task it does not know: its error line, before anything runs
  state=$(block_state "$block")
  record="$OUT/blocks/$(stem "$block").host"  # the machine, and when the block began and finished
  case $state in
    packed) echo "$block: done, in $(packed_in "$block")"; continue ;;
    done) [ -f "$OUT/blocks/$(stem "$block").tar.xz" ] || pack "$block"; continue ;;
    partial) if [ "$(head -1 "$record" 2>/dev/null)" != "$host" ]; then
               echo "error: block $block was begun on another machine ($(head -1 "$record" 2>/dev/null || echo unknown));" \
                    "remove its unfinished runs and $record, then run it again" >&2
               exit 2
             fi ;;
    todo) echo "$host" > "$record" ;;
  esac
  mapfile -t order < <(group_methods "$group")
  if (( r % 2 == 0 )); then  # every other repeat in reverse, so no method always runs first
    mapfile -t order < <(printf '%s\n' "${order[@]}" | tac)
  fi
  echo "began $(date -u +%FT%TZ)" >> "$record"
  echo "$block: $state, on $host"
  for m in "${order[@]}"; do
    run_method "$block" "$m"
    # A run timed under other load, or whose machine changed speed between it and its AR (its plain steps
    # off AR's: report/timing_marks.py), is run once more right away, alone on the same machine; the marked
    # run moves to $OUT-marked/ (kept, out of the tables) and the block's record says why. Once only: a block
    # resumed after a rerun that is still marked keeps it (the tables mark it), rather than rerun it again.
    d=$(run_dir "$block" "$m")
    why=$(timing_mark "$d")
    if [ -n "$why" ] && ! grep -qF "rerun $m (" "$record"; then
      mkdir -p "$OUT-marked/$(dirname "${d#"$OUT"/}")"
      mv "$d" "$OUT-marked/${d#"$OUT"/}-$(date -u +%Y%m%dT%H%M%SZ)"
      echo "rerun $m ($why) began $(date -u +%FT%TZ)" >> "$record"
      run_method "$block" "$m"
      echo "rerun finished $(date -u +%FT%TZ)" >> "$record"
    fi
  done
  echo "finished $(date -u +%FT%TZ)" >> "$record"
  pack "$block"
done
