"""Benchmark: load and summarise the bundled trace, and regenerate it.

    python benchmarks/trace_load.py

Prints wall times (best of N) for `rlsim.trace.format.load` on traces/math17k.parquet (target: under
one second), for `trace_stats`, and for regenerating the whole trace with `synthesize`.
"""

from __future__ import annotations

import time

from rlsim.paths import bundled, default_trace
from rlsim.trace.format import load
from rlsim.trace.stats import trace_stats
from rlsim.trace.synth import SynthConfig, load_prompts, synthesize


def best_of(fn, repeat: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    path = default_trace()
    trace = load(path)
    rows = len(trace.table)
    prompts = load_prompts(bundled("sources/dapo_math_17k_prompts.parquet"))
    cfg = SynthConfig(samples_per_prompt=20, epochs=2, seed=0)  # the bundled trace's shape
    print(f"trace: {path} ({path.stat().st_size / 2**20:.1f} MiB, {rows:,} rows)")
    print(f"load          {best_of(lambda: load(path), 5):6.3f} s   (target < 1 s)")
    print(f"trace_stats   {best_of(lambda: trace_stats(trace), 3):6.3f} s")
    print(f"synthesize    {best_of(lambda: synthesize(cfg, prompts), 3):6.3f} s")


if __name__ == "__main__":
    main()
