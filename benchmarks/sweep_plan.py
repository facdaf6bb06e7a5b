"""Sweep throughput (points/s through a process pool and a local Ray) and `rlsim plan` wall time.

    python benchmarks/sweep_plan.py [--workers 2]

The sweep is the 50-point grid of tests/test_sweep_plan.py (5 GPU counts x 5 policies x 2 rho on a
64-prompt synthetic trace). Each executor runs it twice into a fresh file; the second run is the
figure (the first includes starting workers and generating the traces they cache). The plan is
`rlsim plan --target-epoch-hours 3.4 --no-cache` on the bundled trace with its defaults (every
policy but oracle, 8..256 GPUs colocated at the profile's TP, halving from 2 to 6 simulated steps,
3 seeds for the finalists), run as a user runs it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

from rlsim.plan.grid import parse_grid
from rlsim.plan.sweep import RayExecutor, run_sweep

GRID = {
    "fixed": {"num_prompts": 64, "trace_epochs": 1, "epochs": 1, "prompts_per_step": 16, "samples_per_prompt": 4,
              "max_response_len": 8192},  # fmt: skip
    "grid": {"gpus": [4, 8, 16, 32, 64], "policy": ["sync", "rollpacker", "sortedrl", "histopipe", "async_partial"],
             "rho": [0.5, 0.9]},  # fmt: skip
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    grid = parse_grid(GRID, "benchmark grid")
    tmp = Path(tempfile.mkdtemp(prefix="rlsim-bench-"))
    frames = {}
    for name, make in (
        ("process pool", lambda: ProcessPoolExecutor(max_workers=args.workers)),
        ("local Ray", lambda: RayExecutor(num_cpus=args.workers)),
    ):
        ex = make()
        try:
            run_sweep(grid, tmp / f"{name}-warm.parquet", ex)
            t0 = time.perf_counter()
            rows = run_sweep(grid, tmp / f"{name}.parquet", ex)
            dt = time.perf_counter() - t0
        finally:
            ex.shutdown()
        frames[name] = pd.DataFrame(rows).drop(columns="sim_wall_s")
        print(f"sweep, {len(rows)} points, {name} ({args.workers} workers): {dt:.2f} s, {len(rows) / dt:.1f} points/s")
    same = frames["process pool"].equals(frames["local Ray"])
    print(f"identical rows through both executors: {same}")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "rlsim.cli", "plan", "--target-epoch-hours", "3.4", "--workers", str(args.workers),
         "--no-cache"],
        capture_output=True, text=True,
    )  # fmt: skip
    dt = time.perf_counter() - t0
    print(proc.stdout)
    print(f"rlsim plan on the bundled trace: {dt:.1f} s (exit {proc.returncode})")
    return 0 if same and proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
