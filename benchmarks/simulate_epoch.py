"""Benchmark: one epoch of the bundled trace under the synchronous baseline on 64 GPUs.

    python benchmarks/simulate_epoch.py

Prints the simulation's wall time and peak memory (target: under 5 s per policy-epoch on one
core), the speed ratio over the iteration-by-iteration `--exact` reference on a slice both can
finish (and their makespan difference), the wall time of `rlsim compare` with its defaults
(target with every policy: under 60 s), and the published-shape figures of the baseline.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time

from rlsim.config import ClusterConfig, RLConfig
from rlsim.paths import default_trace
from rlsim.simulate import simulate
from rlsim.trace import load


def main() -> None:
    trace = load(default_trace(), columns=[])
    t0 = time.perf_counter()
    res = simulate(trace, rl=RLConfig(epochs=1))
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s = res.summary
    print(f"one epoch, sync, 64 H100 (16 x TP4), {s['num_requests']:,} requests:")
    print(f"  simulation wall time   {wall:6.2f} s  (target < 5 s)")
    print(f"  peak memory (RSS)      {peak:6.0f} MiB")
    print(f"  simulated epoch time   {s['epoch_time_s'][0] / 3600:6.2f} h")
    print(f"  rollout share of step  {s['rollout_share']:6.1%}  (RollPacker 66-72%, RhymeRL 84-91%)")
    print(f"  first-done idle ratio  {s['first_done_idle_ratio']:6.1%}  (RhymeRL about 76%)")
    print(f"  bubble ratio           {s['bubble_ratio']:6.1%}")

    sl = RLConfig(max_steps=2)
    cl = ClusterConfig(num_gpus=8)
    t0 = time.perf_counter()
    fast = simulate(trace, cluster=cl, rl=sl)
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    exact = simulate(trace, cluster=cl, rl=sl, exact=True)
    t_exact = time.perf_counter() - t0
    diff = abs(fast.summary["total_time_s"] / exact.summary["total_time_s"] - 1)
    print(
        f"slice (2 steps, 8 GPUs): fast {t_fast:.2f} s, exact {t_exact:.2f} s, "
        f"speed ratio {t_exact / t_fast:.0f}x, makespan difference {diff:.2e}"
    )

    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rlsim.cli", "compare"], check=True, capture_output=True)
    print(f"rlsim compare (defaults, 2 epochs, every default policy): {time.perf_counter() - t0:.1f} s (target < 60 s)")


if __name__ == "__main__":
    main()
