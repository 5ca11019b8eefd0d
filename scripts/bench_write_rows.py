"""TR's write_rows kernel (decoding/row_summary.cpp) by rows, at 1 and 2 intra-op threads (not a test).

    python scripts/bench_write_rows.py [--rows 1,2,3,4,8,16,81] [--calls 60]

Each call writes `rows` verified rows of SmolLM2's vocabulary into a (49152, 8) matrix with their probabilities, as
`tr_fused`'s observe does, with 64 MB read before it (untimed) so that the logits start out of the caches, as after a
forward. Prints the median microseconds a call per thread count and rows, the first 10 calls left out.
"""

import argparse
import statistics
import time

import torch

from specbench.decoding.packed_linear import host_kernels

VOCAB, K = 49152, 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,3,4,8,16,81", type=lambda s: [int(r) for r in s.split(",")])
    ap.add_argument("--calls", type=int, default=60)
    args = ap.parse_args()
    kernels = host_kernels()
    matrix, written = torch.zeros(VOCAB, K, dtype=torch.int32), torch.zeros(VOCAB, dtype=torch.bool)
    probs, sweep = torch.zeros(VOCAB, K), torch.ones((64 << 20) // 4)
    print("| threads | rows | median us a call |\n|---:|---:|---:|")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for rows in args.rows:
            logits = torch.randn(rows, VOCAB)
            draft = torch.randint(0, VOCAB, (rows - 1,)) if rows > 1 else None
            times = []
            for _ in range(args.calls):
                sweep.add_(1.0)
                start = time.perf_counter()
                kernels.write_rows(logits, 5, draft, matrix, written, probs, None, None, 1.0)
                times.append(time.perf_counter() - start)
            print(f"| {threads} | {rows} | {statistics.median(times[10:]) * 1e6:.1f} |")


if __name__ == "__main__":
    main()
