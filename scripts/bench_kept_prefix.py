"""Does a tree step cost more on a cache written in pieces (a kept prefix, `prefix_cache=true`) than on one
prefilled whole? The same compiled forward, the same static buffers, the same context and draft; the cache
filled either in one prefill or in the pieces a five-turn session writes, alternating round by round.

    python scripts/bench_kept_prefix.py --context 3416 --rows 17 --rounds 5

Prints each round's median ms of one step per fill, then the median over rounds. The pieces default to the
turn boundaries of agent_loop's first bugfix session (results/cpu-agent-loop-pc); random tokens, so the
acceptance does not matter, only the forward's cost.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specbench.decoding.engine import Engine
from specbench.decoding.kv_cache import compact_kv_cache, with_cache
from specbench.draft import Draft, DraftTree
from specbench.inputs.models import load_model, named_model_config

SESSION_PIECES = (462, 974, 1326, 1837, 2197, 2708)  # where the session's turns left the kept cache


def fill(engine: Engine, model, context: torch.Tensor, ends: list[int], max_new: int):
    """A turn's cache holding `context`, prefilled up to each of `ends` in turn."""
    cache = engine.new_cache(len(context), max_new)
    start = 0
    with torch.inference_mode():
        for end in ends:
            model(input_ids=context[None, start:end], **with_cache(model, cache), use_cache=True, logits_to_keep=1)
            start = end
    return cache


def step_ms(engine: Engine, cache, context_len: int, draft: Draft, steps: int) -> float:
    """Median ms of one tree forward after `context_len` cached tokens (cut back after each)."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.forward_rows(cache, context_len, draft, 5)
        times.append(time.perf_counter() - t0)
        compact_kv_cache(cache, context_len, [])
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--context", type=int, default=3416, help="cached tokens before the step")
    ap.add_argument("--rows", type=int, default=17, help="the step's rows: the root and a chain of rows - 1")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12, help="timed steps per fill")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_model(named_model_config(args.model), torch.device("cpu"), torch.float32)
    engine = Engine(model, [], compiled=True)
    g = torch.Generator().manual_seed(0)
    context = torch.randint(100, model.config.vocab_size, (args.context,), generator=g)
    draft = Draft(tokens=torch.randint(100, model.config.vocab_size, (args.rows - 1,), generator=g),
                  tree=DraftTree.chain(args.rows - 1))
    fills = {"whole": [args.context],
             "pieces": [p for p in SESSION_PIECES if p < args.context] + [args.context]}
    seen: dict[str, list[float]] = {name: [] for name in fills}
    for rnd in range(args.rounds):
        order = list(fills) if rnd % 2 == 0 else list(reversed(fills))
        for name in order:
            ms = step_ms(engine, fill(engine, model, context, fills[name], 512), args.context, draft, args.steps)
            seen[name].append(ms)
            print(f"round {rnd + 1} {name}: {ms:.1f} ms", flush=True)
    for name, values in seen.items():
        print(f"{name}: median {statistics.median(values):.1f} ms over {len(values)} rounds "
              f"({', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
