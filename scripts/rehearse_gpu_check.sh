#!/usr/bin/env bash
# The GPU node's command rehearsed here, on the CPU, as the node will see it (docs/gpu.md):
#  - a twin of the node's Python environment (torch 2.11, transformers 5.17 and the rest of its package
#    set; hydra, omegaconf, antlr4 and gguf only from the carried wheels), in .venv-node;
#  - the network cut off (unshare -n), HOME and caches new, nothing of this shell's environment;
#  - the plan at most MAX_CALLS calls (specbench/tools/gpu_node/limits.py: 3), each planned call run
#    from a scratch copy holding exactly what that call carries (the checkout's tracked and
#    untracked-not-ignored files plus its .gpu/callN), asserted at most 64 MiB;
#  - the node's folder kept from call to call, as a warm node keeps it;
#  - the last call's output folder checked against what comes back (8 files, 16 MiB each, 2 folders
#    down), and every stage PASS or SKIP(cuda), or, for a stage the node runs on the time left, PARTIAL
#    with every method it started passed (a slow CPU's time ran out, not the code);
#  - then, on the same twin: `python run.py` with the embedded model in the cache (rc 0), the same
#    without gguf (one error: line, rc 2), and the version-sensitive tests.
#
#   bash scripts/rehearse_gpu_check.sh            # NODE_VENV=.venv-node WORK=<temp dir> KEEP=1 to keep it
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
NODE_VENV=${NODE_VENV:-$ROOT/.venv-node}
WORK=${WORK:-$(mktemp -d /tmp/rehearse-gpu.XXXXXX)}
mkdir -p "$WORK"
LIMIT=$((64 * 1024 * 1024))
HOST_PY=${HOST_PY:-python}   # this machine's environment: pip, network, the project installed
start=$SECONDS
NODE_PACKAGES="torch==2.11.0 transformers==5.17.0 accelerate==1.15.0 safetensors==0.8.0 tokenizers==0.23.2
  sentencepiece protobuf numpy pandas matplotlib scipy tqdm pytest pytest-xdist ninja packaging pyyaml"

echo "== twin of the node's environment ($NODE_VENV)"
if ! "$NODE_VENV/bin/python" -c "import torch, transformers, sys; sys.exit(not (torch.__version__.startswith('2.11.0') and transformers.__version__ == '5.17.0'))" 2>/dev/null; then
  rm -rf "$NODE_VENV"
  python3 -m venv "$NODE_VENV"
  # shellcheck disable=SC2086
  "$NODE_VENV/bin/python" -m pip install --quiet $NODE_PACKAGES 2>&1 | grep -v "^WARNING: Location" || true
  "$NODE_VENV/bin/python" -c "import torch, transformers" || { echo "rehearsal: the twin did not install" >&2; exit 1; }
fi
for absent in hydra omegaconf antlr4 gguf wandb pydivsufsort specbench; do
  if (cd / && "$NODE_VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$absent') is None)"); then
    echo "rehearsal: $absent is installed in $NODE_VENV, but the node lacks it" >&2; exit 1
  fi
done
"$NODE_VENV/bin/python" -c "import torch, transformers; print('twin: torch', torch.__version__, '| transformers', transformers.__version__)"

echo "== pack (here, with the network)"
"$HOST_PY" scripts/gpu_pack.py --json > "$WORK/plan.json"
calls=$("$HOST_PY" -c "import json; print(len(json.load(open('$WORK/plan.json'))['calls']))")
max_calls=$("$HOST_PY" -c "import json; print(json.load(open('$WORK/plan.json'))['max_calls'])")
echo "plan: $calls calls (at most $max_calls)"
if [ "$calls" -gt "$max_calls" ]; then
  echo "rehearsal: the weights take $calls calls, more than $max_calls: the checkout has grown (results/README.md)" >&2; exit 1
fi

node_env() {  # the node: its own Python first on PATH, a new HOME, nothing else of ours
  env -i PATH="$NODE_VENV/bin:/usr/local/bin:/usr/bin:/bin" HOME="$WORK/home" LANG=C.UTF-8 \
    SPECBENCH_NODE_DIR="$WORK/node" "$@"
}

largest=0
for i in $(seq 1 "$calls"); do
  carry=$("$HOST_PY" -c "import json; print(' '.join(json.load(open('$WORK/plan.json'))['calls'][$i-1]['carry']))")
  command=$("$HOST_PY" -c "import json; print(json.load(open('$WORK/plan.json'))['calls'][$i-1]['command'])")
  copy="$WORK/call$i/repo"; out="$WORK/call$i/out"
  mkdir -p "$copy" "$out" "$WORK/home"
  git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - 2>/dev/null | tar -xf - -C "$copy"
  for path in $carry; do mkdir -p "$copy/$(dirname "$path")"; cp -r "$path" "$copy/$path"; done
  size=$(du -sb --apparent-size "$copy" | cut -f1)
  [ "$size" -gt "$largest" ] && largest=$size
  echo "== call $i of $calls: carry $carry, $((size / 1024 / 1024)) MiB: $command"
  if [ "$size" -gt "$LIMIT" ]; then echo "rehearsal: call $i carries $size bytes, over 64 MiB" >&2; exit 1; fi
  final=0; [ "$i" = "$calls" ] && final=1
  [ "$final" = 1 ] && command="$command --cpu"
  (cd "$copy" && node_env OUT="$out" unshare -n bash -c "$command") 2>&1 | tee "$WORK/call$i.log" | tail -n 60
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then echo "rehearsal: call $i exited $rc" >&2; exit 1; fi
done

echo "== what came back"
"$NODE_VENV/bin/python" - "$WORK/call$calls/out" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, ".")
from specbench.tools.gpu_node.limits import STAGES, check_output_folder
from specbench.tools.gpu_node.real_model import short_of_time_only
out = Path(sys.argv[1])
files = sorted(f for f in out.rglob("*") if f.is_file())
problems = check_output_folder(out)
stages = json.loads((out / "stages.json").read_text())
# a stage the node runs only on the time left (GPU budget 0) may run short of time on a slow CPU too:
# accepted when every method it started passed and at least one did; any failure still fails
spare = {st.name for st in STAGES if st.gpu_budget == 0}
short = {k: v["detail"] for k, v in stages.items() if k in spare and short_of_time_only(v)}
bad = {k: v["status"] for k, v in stages.items() if v["status"] not in ("PASS", "SKIP(cuda)") and k not in short}
print(f"{len(files)} files back: " + ", ".join(f"{f.name} ({f.stat().st_size / 1024:.0f} KiB)" for f in files))
print("stages: " + ", ".join(f"{k} {v['status']}" for k, v in stages.items()))
for k, detail in short.items():
    print(f"rehearsal: {k} ran short of this machine's time ({detail}); accepted: on the node it runs on the time left")
if problems or bad:
    sys.exit(f"rehearsal: output folder {problems or ''} stages not PASS or SKIP(cuda): {bad or ''}")
PY
echo "calls: $calls of at most $max_calls; largest call: $((largest / 1024)) KiB of $((LIMIT / 1024)) KiB"

echo "== python run.py on the twin, offline, the embedded model in the cache"
copy="$WORK/call$calls/repo"
site="$WORK/node/site"
cache="$WORK/node/cache"
runargs="method=pld task=mini task.limit=1 max_new_tokens=8 warmup=0 compile=off cost_curve=off wandb.enabled=false progress=false"
(cd "$copy" && node_env PYTHONPATH="$site" SPECBENCH_CACHE="$cache" unshare -n python3 run.py $runargs results_root="$WORK/runs") \
  > "$WORK/run.log" 2>&1 || { tail -20 "$WORK/run.log"; echo "rehearsal: run.py failed on the twin" >&2; exit 1; }
grep -E "^\| pld|^results:" "$WORK/run.log"

echo "== the same without gguf (a new cache: the GGUF must be converted)"
nogguf="$WORK/site-without-gguf"; mkdir -p "$nogguf" "$WORK/cache2/gguf"
for d in "$site"/*; do case "$(basename "$d")" in gguf|gguf-*) ;; *) ln -sfn "$d" "$nogguf/";; esac; done
cp -r "$cache/gguf/." "$WORK/cache2/gguf/"
set +e
(cd "$copy" && node_env PYTHONPATH="$nogguf" SPECBENCH_CACHE="$WORK/cache2" unshare -n python3 run.py $runargs results_root="$WORK/runs2") \
  > "$WORK/nogguf.out" 2> "$WORK/nogguf.err"
rc=$?
set -e
cat "$WORK/nogguf.err"
if [ "$rc" != 2 ] || [ "$(grep -c . "$WORK/nogguf.err")" != 1 ] || ! grep -q "^error: .*gguf" "$WORK/nogguf.err"; then
  echo "rehearsal: without gguf, expected one error: line naming it and exit 2 (got $rc)" >&2; exit 1
fi

echo "== version-sensitive tests on the twin (torch 2.11, transformers 5.17)"
(cd "$copy" && node_env PYTHONPATH="$site" SPECBENCH_CACHE="$cache" SPECBENCH_REQUIRE_KERNEL="${SPECBENCH_REQUIRE_KERNEL:-}" \
  python3 -m pytest -q -p no:cacheprovider tests/test_packed_linear.py tests/test_compiled.py \
  tests/test_forward_choice.py tests/test_engine_tiny.py tests/test_gpu_check.py) 2>&1 | tail -n 5
[ "${PIPESTATUS[0]}" = 0 ] || { echo "rehearsal: version-sensitive tests failed on the twin" >&2; exit 1; }

echo "rehearsal passed in $((SECONDS - start)) s (work: $WORK)"
[ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
