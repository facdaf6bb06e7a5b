"""Data-parallel attention against TP instances, side by side on the same GPUs (docs/calibrate.md).

    python benchmarks/dp_attention.py [--markdown | --readme]

For each MoE model, the same cluster rolls out with TP instances that hold the experts by expert
parallelism inside each instance (`--tp G --ep G`), and with data-parallel attention over groups of
G ranks (`--tp 1 --dp G --ep G`), both derived by `rlsim profile derive`, under the synchronous
policy on the bundled trace (a stand-in: no published run with DP attention states its lengths). It
prints each run's rollout and step seconds, the share of rank iterations a DP rank idled through
while its group ran (the lockstep's tail), and the simulator's wall time (the DP runs go iteration by
iteration on the reference engine). Every figure but the wall time is the simulator's output and
the same on any machine; the table `dp_attention` (docs/calibrate.md) is written with `--readme`,
with the machine and its load.
"""

from __future__ import annotations

import sys
import time

from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.derive.derive import derive_profile, setup
from rlsim.hostload import LoadMeter
from rlsim.package_data.markers import emit, machine_note
from rlsim.paths import default_trace
from rlsim.profile import profile_from_dict
from rlsim.sim.simulate import simulate
from rlsim.trace.format import load

# (model, GPU, GPUs, group, dtype, gpu_memory_utilization): Qwen3-30B-A3B at bf16; DeepSeek-V3 at fp8,
# where its weights fit 16 H100s
CASES = (
    ("qwen3-30b-a3b", "h100", 64, 8, "bf16", 0.8),
    ("deepseek-v3", "h100", 128, 16, "fp8", 0.9),
)
STEPS = 3


def run(steps: int) -> list[dict]:
    trace = load(default_trace(), columns=[])
    rows = []
    for model, gpu, gpus, g, dtype, util in CASES:
        for label, tp, dp in ((f"TP {g}, EP {g}", g, 1), (f"DP {g} x TP 1, EP {g}", 1, g)):
            s = setup(model, gpu, tp, ep=g, dtype=dtype, dp=dp)
            prof = profile_from_dict(derive_profile(s, EngineConfig(gpu_memory_utilization=util)))
            t0 = time.perf_counter()
            res = simulate(trace, "sync", ClusterConfig(num_gpus=gpus), RLConfig(max_steps=steps), prof, tables=False)
            wall = time.perf_counter() - t0
            st, dpc = res.steps, res.summary.get("data_parallel")
            idle = dpc["idle_rank_iterations"] / (dpc["group_iterations"] * g) if dpc else None
            name = model if dtype == "bf16" else f"{model} ({dtype})"
            rows.append({
                "model": name, "gpus": f"{gpus}x {gpu}", "rollout": label, "gen_s": st["timing_s/gen"].mean(),
                "step_s": st["timing_s/step"].mean(), "idle": idle, "wall_s": wall,
            })  # fmt: skip
    return rows


def main() -> int:
    argv = sys.argv[1:]
    meter = LoadMeter()
    rows = [
        "| model | GPUs | rollout | generation s | step s | DP ranks idle | sim wall s |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in run(STEPS):
        idle = "-" if r["idle"] is None else f"{r['idle']:.0%}"
        rows.append(f"| {r['model']} | {r['gpus']} | {r['rollout']} | {r['gen_s']:.1f} | {r['step_s']:.1f} | {idle} | "
                    f"{r['wall_s']:.1f} |")  # fmt: skip
    rows += ["", f"The synchronous policy, colocated, {STEPS} steps of the bundled trace; mean seconds a step. "
             f"{machine_note(meter, 'dp_attention.py')}"]  # fmt: skip
    emit("dp_attention", "\n".join(rows), argv)
    if not {"--markdown", "--readme"} & set(argv):
        print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
