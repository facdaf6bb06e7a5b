"""Benchmark: the compiled scheduler against `InstanceScheduler`, side by side in one process.

    python benchmarks/compiled_core.py [--requests 20000] [--markdown | --readme]

One rollout instance of the default cluster (its KV capacity, `block_size`, `max_num_seqs` and
`max_num_batched_tokens` under async scheduling, as `rlsim compare` runs it) is given the first
`--requests` requests of the bundled trace (prompt and response lengths, prompts' prefix chains)
and run to the end three ways, each the same loop of `jump_plan` / `advance` / `schedule` /
`complete`: the Python scheduler; the compiled scheduler called once per step from Python (as a
Python engine loop would call it); and the same loop compiled, which is where the engine's loop
over its instances goes. All three must give the same finishes and iterations, or it stops.
Prints each one's seconds (best of three) and its speed-up over the Python scheduler, with the
machine and its load; `--markdown` prints, and `--readme` also writes into docs/speed.md, the
table `compiled_core`.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from rlsim.config import ClusterConfig
from rlsim.hostload import LoadMeter
from rlsim.package_data.markers import emit, machine_note
from rlsim.paths import default_trace
from rlsim.profile import load_profile
from rlsim.protocol import Request
from rlsim.sim.compiled import scheduler as cs
from rlsim.sim.compiled.jit import PURE, njit
from rlsim.sim.scheduler import vllm_scheduler
from rlsim.sim.seq import Seq
from rlsim.trace.format import load


def _workload(n: int) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    prof = load_profile(ClusterConfig().profile)
    e = prof.engine
    kw = {
        "num_blocks": prof.kv_capacity_tokens // e.block_size, "block_size": e.block_size,
        "max_num_seqs": e.max_num_seqs, "max_num_batched_tokens": e.max_num_batched_tokens,
        "enable_chunked_prefill": e.enable_chunked_prefill, "enable_prefix_caching": e.enable_prefix_caching,
        "async_scheduling": e.async_scheduling,
    }  # fmt: skip
    df = load(default_trace(), columns=[]).table.head(n)
    out = np.minimum(df["num_output_tokens"].to_numpy(), 20480)
    return kw, df["prompt_id"].to_numpy(), df["num_prompt_tokens"].to_numpy(), out


def run_python(kw: dict, pid: np.ndarray, npt: np.ndarray, tgt: np.ndarray) -> tuple[int, int, int]:
    s = vllm_scheduler(**kw)
    for i in range(len(pid)):
        s.add(Seq(Request(i, int(pid[i]), 0, 0, int(npt[i]), 20480, int(tgt[i]), 0, 0), int(tgt[i])))
    finished = steps = 0
    while s.running or s.waiting:
        k = s.jump_plan()
        if k:
            s.advance(k)
            done = s.finish_due()
        else:
            out = s.schedule()
            if not out.num_decodes and not out.chunks and not out.preempted:
                s.release_finishing()
                continue
            done = s.complete(out)
        finished += len(done)
        steps += 1
    return finished, steps, s.iters


def _compiled_state(kw: dict, pid: np.ndarray, npt: np.ndarray, tgt: np.ndarray) -> cs.SchedState:
    s = cs.new_scheduler(**kw)
    for i in range(len(pid)):
        cs.add(s, i, int(pid[i]), int(npt[i]), 20480, 0, False, int(tgt[i]), 0, False)
    return s


def run_compiled_calls(kw: dict, pid: np.ndarray, npt: np.ndarray, tgt: np.ndarray) -> tuple[int, int, int]:
    """`_loop` run as Python: each of its scheduler calls a compiled call."""
    return getattr(_loop, "py_func", _loop)(_compiled_state(kw, pid, npt, tgt))


@njit
def _loop(s: cs.SchedState) -> tuple[int, int, int]:
    finished = steps = 0
    while s.num_running or s.w_len:
        k = cs.jump_plan(s)
        if k:
            cs.advance(s, k)
            cs.finish_due(s)
        else:
            cs.schedule(s)
            if not s.out_num_decodes and not s.out_num_chunks and not s.out_num_preempted:
                cs.release_finishing(s)
                continue
            cs.complete(s)
        finished += s.num_due
        steps += 1
    return finished, steps, s.iters


def run_compiled_loop(kw: dict, pid: np.ndarray, npt: np.ndarray, tgt: np.ndarray) -> tuple[int, int, int]:
    return _loop(_compiled_state(kw, pid, npt, tgt))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--markdown", action="store_true", help="print the table it writes")
    ap.add_argument("--readme", action="store_true", help="print the table and write it into docs/speed.md")
    a = ap.parse_args()
    work = _workload(a.requests)
    kw = work[0]
    print(f"one instance: {a.requests:,} requests of the bundled trace, {kw}; {'pure Python' if PURE else 'compiled'}")
    run_compiled_loop(*work)  # compile (or load the cache) before timing
    run_compiled_calls(*work)
    meter = LoadMeter()
    rows, ref, base = [], None, None
    for label, fn in (("`InstanceScheduler` (Python)", run_python),
                      ("compiled, called once per step from Python", run_compiled_calls),
                      ("compiled, the loop compiled too", run_compiled_loop)):  # fmt: skip
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            got = fn(*work)
            best = min(best, time.perf_counter() - t0)
        if ref is None:
            ref, base = got, best
        elif got != ref:
            raise SystemExit(f"{label} differs: {got} against {ref} (finished, steps, iterations)")
        rows.append((label, best, base / best))
    note = machine_note(meter, "compiled_core.py")
    print(f"{ref[0]:,} finished in {ref[2]:,} iterations, {ref[1]:,} steps of the loop (a jump or one iteration)")
    table = ["| scheduler | seconds (best of 3) | speed-up | per step |", "|---|---|---|---|"]
    for label, best, speedup in rows:
        print(f"  {label:45s} {best:7.3f} s  {speedup:5.1f}x  ({best / ref[1] * 1e6:.2f} us a step)")
        table.append(f"| {label} | {best:.3f} | {speedup:.1f}x | {best / ref[1] * 1e6:.1f} us |")
    print(note)
    emit("compiled_core", "\n".join(table) + "\n\n" + note, sys.argv)


if __name__ == "__main__":
    main()
