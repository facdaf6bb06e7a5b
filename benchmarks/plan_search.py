"""Benchmark: `rlsim plan` over a 200-candidate space, cold and then from its cache.

    python benchmarks/plan_search.py [--workers 2] [--min-steps 2] [--steps 6]

The space: 5 policies (sync, one_step_off, async_partial, rollpacker, sortedrl) x 5 GPU counts
(16, 32, 64, 96, 128) x 4 placements (colocated, and disaggregated with 1/8, 1/4 or 1/2 of the
GPUs training) x 2 rollout TPs (4 and 8, the Qwen2.5-32B H100 family) = 200 candidates, on the
bundled trace with DAPO's batch, for the fastest epoch on at most 128 GPUs. It runs as a user runs
it (the command line, a fresh cache file), then asks a second question over the same space (the
fewest GPU-hours with a 3-hour epoch) against the same cache, which reuses the first's points.
Prints each wall time, the simulations run and the cache hits, and the answers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SPACE = [
    "--policies", "sync,one_step_off,async_partial,rollpacker,sortedrl", "--gpus", "16,32,64,96,128",
    "--placement", "colocated,disaggregated", "--train-share", "0.125,0.25,0.5", "--tp", "4,8",
]  # fmt: skip


def _plan(args: list[str]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "rlsim.cli", "plan", *args, "--json"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(f"rlsim plan exited {out.returncode}: {out.stderr.strip()[-2000:]}")
    return wall, json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--min-steps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    with tempfile.TemporaryDirectory() as tmp:
        common = [*SPACE, "--workers", str(a.workers), "--min-steps", str(a.min_steps), "--steps", str(a.steps),
                  "--cache", os.path.join(tmp, "plan.jsonl")]  # fmt: skip
        for label, objective in (("fastest epoch on <= 128 GPUs", ["--gpu-budget", "128"]),
                                 ("fewest GPU-hours, epoch <= 3 h", ["--target-epoch-hours", "3"])):  # fmt: skip
            wall, res = _plan([*objective, *common])
            print(
                f"{label}: {res['num_candidates']} candidates, rounds of {'/'.join(map(str, res['rungs']))} steps, "
                f"{res['simulated']} simulations + {res['cache_hits']} from the cache: {wall:.1f} s (target 60 s)"
            )
            for r in res["answers"]:
                tie = " (tie)" if r["tie"] else ""
                print(f"  {r['policy']:14s} {r['label']:32s} epoch {r['epoch_hours']:.2f} h "
                      f"[{r['epoch_hours_range'][0]:.2f}, {r['epoch_hours_range'][1]:.2f}], "
                      f"{r['gpu_hours']:.0f} GPU-h, rank by seed {r['rank_by_seed']}{tie}")  # fmt: skip
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
