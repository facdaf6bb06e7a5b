"""Benchmark: the simulator's speed, per policy, against a bare event-jumping heap loop.

    python benchmarks/simulate_epoch.py [--policies sync,rollpacker] [--skip-cli] [--big] [--before REV]
                                        [--markdown | --readme]

For each policy (default: every policy `rlsim compare` runs), one epoch of the bundled trace
(286,672 requests at R0 = 16, 64 H100s as 16 TP 4 instances) is simulated in a fresh process,
which first times the reference: a bare heap loop that does the least an event-jumping simulator
of the same step must (every request's finish popped from a per-instance heap, the batch's
closed-form iteration cost advanced to it, the step ending at the slowest instance), with no
scheduler, KV cache, policy or records. The ratio of the two, measured seconds apart in one
process, is the figure that holds on a noisy shared machine (target: 3x; a 1.5 s target is
about that on an idle core). For sync it also times the floor: the same driver, policy and records
over `_HeapEngine` (the heap loop's cost behind the `Engine` protocol), which no faster scheduler
can go below. Also printed: each policy's peak memory, the fast path against the
iteration-by-iteration `--exact` reference on a slice both finish, the wall time of
`rlsim compare` and `rlsim plan` with their defaults (`--skip-cli` leaves them out) and, with
`--big`, one epoch of a 10x trace (every prompt ten times under new ids, 2.87M requests).
With `--markdown` it prints, and with `--readme` also writes into README.md, two tables: the
synchronous baseline's figures (`sync_baseline`) and the simulator's speed (`simulator_speed`),
each with the machine and its load during the run.

`--before REV` measures a git revision of this repository side by side with the working tree, in
the same run: its code is checked out into a temporary worktree, and every figure (each policy's
epoch and its heap loop, `rlsim compare`, `rlsim plan`, the 10x trace) is taken by a fresh process
running that revision's own benchmark (`--one`, `--big-child`) or CLI (with it first on
`PYTHONPATH`), right before the same figure of the working tree. The tables then give both.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import pandas as pd

from policies.registry import COMPARE_DEFAULT, make_policy
from rlsim.config import ClusterConfig, RLConfig
from rlsim.driver.loop import run_loop
from rlsim.hostload import LoadMeter
from rlsim.package_data.markers import emit, machine_note
from rlsim.paths import default_trace
from rlsim.profile import load_profile
from rlsim.protocol import EventBatch
from rlsim.sim.simulate import simulate
from rlsim.trace.format import Trace, load, save


def heap_loop_epoch(trace, cluster, rl) -> float:  # noqa: ANN001
    """The reference: one epoch of synchronous steps as a bare event-jumping heap loop.

    Each step's P0 x R0 samples are dealt to the instances in turn; an instance decodes all of
    its requests as one batch (no KV limit, no prefill, no scheduler); between finishes the
    batch is fixed, so the loop jumps from one finish to the next with the profile's closed
    form. Returns the simulated epoch time (rollout only)."""
    prof = load_profile(cluster.profile)
    n = cluster.num_instances(prof.tensor_parallel_size)
    tw, al, be = prof.t_w_s, prof.alpha_s + prof.gamma_s, prof.beta_s
    df = trace.table
    epoch = trace.epochs[0]
    rows = df[(df["epoch"] == epoch) & (df["sample_idx"] < rl.samples_per_prompt)]
    pids = rows["prompt_id"].to_numpy()
    out = np.minimum(rows["num_output_tokens"].to_numpy(), rl.max_response_len)
    prompt = rows["num_prompt_tokens"].to_numpy()
    order = np.random.default_rng(rl.seed).permutation(np.unique(pids))
    rank = np.empty(order.max() + 1, dtype=np.int64)
    rank[order] = np.arange(len(order))
    by_step = np.argsort(rank[pids], kind="stable")
    per_step = rl.prompts_per_step * rl.samples_per_prompt
    out, prompt = out.tolist(), prompt.tolist()
    total = 0.0
    for lo in range(0, len(by_step), per_step):
        idx = by_step[lo : lo + per_step].tolist()
        step_end = 0.0
        for i in range(n):
            heap = [(out[j], j) for j in idx[i::n]]
            heapq.heapify(heap)
            t, it, b = 0.0, 0, len(heap)
            ctx = float(sum(prompt[j] for _, j in heap))
            while heap:
                k_end, j = heapq.heappop(heap)
                k = k_end - it
                if k > 0:  # k iterations of a fixed batch of b: k*a + beta*b*k*(k-1)/2
                    t += (tw + al * b + be * (ctx + b)) * k + be * b * k * (k - 1) / 2
                    ctx += b * k
                    it = k_end
                ctx -= prompt[j] + k_end  # its KV leaves the batch
                b -= 1
            step_end = max(step_end, t)
        total += step_end
    return total


class _HeapEngine:
    """The `Engine` protocol at the heap loop's cost: each request finishes on its own, `dt` seconds
    a token after its submission (no batching, scheduler, KV cache or pausing), off one heap of
    finish and timer events (with `until_idle`, all finishes up to the next timer in one batch).
    Under it, a run times what the driver, the policy and the records cost
    per request: the floor of any engine the same policy objects are driven through."""

    def __init__(self, num_instances: int, dt: float) -> None:
        self.num_instances, self.dt, self._now, self._n = num_instances, dt, 0.0, 0
        self._heap: list = []  # (time, order, request or timer tag)

    @property
    def now(self) -> float:
        return self._now

    def submit(self, requests) -> None:  # noqa: ANN001
        for req in requests:
            self._n += 1
            heapq.heappush(self._heap, (self._now + min(req.target_tokens, req.max_tokens) * self.dt, self._n, req))

    def abort(self, request_ids) -> None:  # noqa: ANN001
        raise NotImplementedError("the floor engine runs policies that do not abort (sync)")

    def call_at(self, when: float, tag: str) -> None:
        self._n += 1
        heapq.heappush(self._heap, (max(when, self._now), self._n, tag))

    def pause(self, sleep: bool = False) -> None:
        pass

    def resume(self) -> None:
        pass

    def step(self, until_idle: bool = False) -> EventBatch:
        """The next finish or timer; `until_idle`: every finish up to the last or the next timer."""
        out = EventBatch()
        heap = self._heap
        while heap:
            when, _, item = heapq.heappop(heap)
            self._now = when
            if isinstance(item, str):
                out.timer(item, when)
                break
            n = min(item.target_tokens, item.max_tokens)
            out.finished(item.request_id, when, item.instance, n, "length" if n >= item.max_tokens else "stop")
            if not until_idle:
                break
        return out

    def busy_time(self, instance: int) -> float:
        return 0.0


def floor_epoch(trace, cluster, rl) -> float:  # noqa: ANN001
    """Wall seconds of one sync epoch of the driver, policy and records over `_HeapEngine`."""
    prof = load_profile(cluster.profile)
    engine = _HeapEngine(cluster.num_instances(prof.tensor_parallel_size), 0.02)
    gc.disable()  # as `simulate` runs the loop
    try:
        t0 = time.perf_counter()
        run_loop(engine, make_policy("sync"), trace, prof, cluster, rl)
        return time.perf_counter() - t0
    finally:
        gc.enable()


def _peak_mib() -> float:
    """This process's peak resident memory. Linux's VmHWM, since `ru_maxrss` of a process started
    from a large parent can report the parent's size at the fork."""
    try:
        for line in open("/proc/self/status"):  # noqa: SIM115, PTH123
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(policy: str) -> dict:
    """In this (fresh) process: the heap loop, then one epoch of `policy`; figures as a dict."""
    trace = load(default_trace(), columns=[])
    rl, cluster = RLConfig(epochs=1), ClusterConfig()
    ref = math.inf
    for _ in range(3):  # best of three: the reference is short, so one pause of the host would skew it
        t0 = time.perf_counter()
        heap_loop_epoch(trace, cluster, rl)
        ref = min(ref, time.perf_counter() - t0)
    t0 = time.perf_counter()
    res = simulate(trace, policy, cluster=cluster, rl=rl, tables=False)
    wall = time.perf_counter() - t0
    peak = _peak_mib()
    floor = floor_epoch(trace, cluster, rl) if policy == "sync" else None
    s = res.summary
    return {
        "policy": policy, "wall_s": wall, "heap_loop_s": ref, "ratio": wall / ref, "floor_s": floor,
        "peak_mib": peak, "requests": s["num_requests"], "epoch_h": s["total_time_s"] / 3600,
        "rollout_share": s["rollout_share"], "first_done_idle_ratio": s["first_done_idle_ratio"],
        "bubble_ratio": s["bubble_ratio"],
    }  # fmt: skip


def write_big(path: str) -> None:
    """The bundled trace's first epoch with every prompt repeated ten times (new ids), as Parquet."""
    trace = load(default_trace())
    df = trace.table[trace.table["epoch"] == trace.epochs[0]]
    step = int(df["prompt_id"].max()) + 1
    tiled = pd.concat([df.assign(prompt_id=df["prompt_id"] + r * step) for r in range(10)], ignore_index=True)
    tiled = tiled.sort_values(["epoch", "prompt_id", "sample_idx"], kind="stable").reset_index(drop=True)
    save(Trace(tiled, trace.meta), path)


def big(path: str) -> dict:
    """In this (fresh) process, as a user would: load the 10x trace, simulate one sync epoch.
    `wall_s` counts both; `sim_s` the simulation alone, as `one` times the bundled trace's epoch."""
    t0 = time.perf_counter()
    trace = load(path, columns=[])
    t1 = time.perf_counter()
    res = simulate(trace, "sync", rl=RLConfig(epochs=1), tables=False)
    t2 = time.perf_counter()
    return {
        "wall_s": t2 - t0, "sim_s": t2 - t1, "requests": res.summary["num_requests"], "peak_mib": _peak_mib(),
    }  # fmt: skip


def _env(root: str | None) -> dict | None:
    """The environment of a child running the code under `root` (None: this working tree)."""
    if root is None:
        return None
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def _child(args: list[str], root: str | None = None) -> dict:
    """A fresh process of this benchmark (of the revision checked out under `root`, if given)."""
    script = __file__ if root is None else os.path.join(root, "benchmarks", "simulate_epoch.py")
    out = subprocess.run([sys.executable, script, *args], check=True, capture_output=True, text=True, env=_env(root))
    return json.loads(out.stdout.strip().splitlines()[-1])


def _wall(cmd: list[str], root: str | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=_env(root), cwd=root)
    return time.perf_counter() - t0


class _Worktree:
    """A temporary git worktree of revision `rev` of this repository (None: no worktree)."""

    def __init__(self, rev: str | None) -> None:
        self.rev, self.path, self._tmp = rev, None, None

    def __enter__(self) -> str | None:
        if self.rev is None:
            return None
        self._tmp = tempfile.mkdtemp(prefix="rlsim-before-")
        self.path = os.path.join(self._tmp, "tree")
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        subprocess.run(["git", "-C", repo, "worktree", "add", "-q", "--detach", self.path, self.rev], check=True)
        return self.path

    def __exit__(self, *exc: object) -> None:
        if self.path is not None:
            repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            subprocess.run(["git", "-C", repo, "worktree", "remove", "--force", self.path], check=False)
            os.rmdir(self._tmp)


def _fmt_pair(before: float | None, after: float, spec: str = ".2f") -> str:
    return f"{after:{spec}}" if before is None else f"{before:{spec}} | {after:{spec}}"


def main() -> None:  # noqa: C901, PLR0915 - one report, figure by figure
    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", default=",".join(COMPARE_DEFAULT))
    ap.add_argument("--skip-cli", action="store_true", help="leave out rlsim compare and rlsim plan")
    ap.add_argument("--big", action="store_true", help="also one epoch of the 10x trace")
    ap.add_argument("--before", metavar="REV", help="also measure this git revision, side by side")
    ap.add_argument("--markdown", action="store_true", help="print the tables it writes")
    ap.add_argument("--readme", action="store_true", help="print the tables and write them into their pages")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--big-child", help=argparse.SUPPRESS)
    ap.add_argument("--write-big", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one)))
        return
    if a.write_big:
        write_big(a.write_big)
        return
    if a.big_child:
        print(json.dumps(big(a.big_child)))
        return
    with _Worktree(a.before) as before:
        report(a, before)


def report(a: argparse.Namespace, before: str | None) -> None:  # noqa: C901, PLR0915
    """Every figure, the revision under `before` (if any) measured right before this tree's."""
    meter = LoadMeter()
    loadavg = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, load average {loadavg:.2f} at start; one policy-epoch per fresh process")
    if before:
        git = subprocess.run(["git", "-C", before, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        print(f"before: {a.before} ({git.stdout.strip()}), measured right before each figure of this tree")
    b = before is not None
    for root in [before, None] if b else [None]:  # each tree's compiled core built first, untimed: one
        _wall([sys.executable, "-m", "rlsim.cli", "compare", "--max-steps", "1"], root)  # step of every policy
    print(f"{'policy':26s} {'before (s)' if b else '':>10s} {'epoch (s)':>9s} {'heap loop (s)':>13s} "
          f"{'ratio':>6s} {'peak MiB':>8s}")  # fmt: skip
    rows, prior = [], []
    if b:
        speed = [
            "| policy | one epoch before (s) | after (s) | speed-up | heap loop (s) | ratio before | ratio after | "
            "peak MiB before | after |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
    else:
        speed = ["| policy | one epoch (s) | heap loop (s) | ratio | peak MiB |", "|---|---|---|---|---|"]
    for name in a.policies.split(","):
        p = _child(["--one", name], before) if b else None
        r = _child(["--one", name])
        rows.append(r)
        prior.append(p)
        was = f"{p['wall_s']:10.2f}" if p else " " * 10
        line = f"{name:26s} {was} {r['wall_s']:9.2f} {r['heap_loop_s']:13.2f} {r['ratio']:5.1f}x {r['peak_mib']:8.0f}"
        print(line, flush=True)
        if p:
            speed.append(f"| {name} | {p['wall_s']:.2f} | {r['wall_s']:.2f} | {p['wall_s'] / r['wall_s']:.2f}x | "
                         f"{r['heap_loop_s']:.2f} | {p['ratio']:.1f}x | {r['ratio']:.1f}x | {p['peak_mib']:.0f} | "
                         f"{r['peak_mib']:.0f} |")  # fmt: skip
        else:
            speed.append(f"| {name} | {r['wall_s']:.2f} | {r['heap_loop_s']:.2f} | {r['ratio']:.1f}x | "
                         f"{r['peak_mib']:.0f} |")  # fmt: skip
    ratios = [r["ratio"] for r in rows]
    print(f"ratio to the heap loop: median {np.median(ratios):.1f}x, worst {max(ratios):.1f}x (target 3.0x)")
    total = sum(r["wall_s"] for r in rows)
    heap = sum(r["heap_loop_s"] for r in rows)
    if b:
        was = sum(p["wall_s"] for p in prior)
        was_ratio = np.median([p["ratio"] for p in prior])
        speed.append(f"| all {len(rows)}, summed | {was:.1f} | {total:.1f} | {was / total:.2f}x | {heap:.2f} | "
                     f"median {was_ratio:.1f}x | median {np.median(ratios):.1f}x | | |")  # fmt: skip
    else:
        speed.append(f"| all {len(rows)}, summed | {total:.1f} | {heap:.2f} | median {np.median(ratios):.1f}x | |")
    baseline = ["| figure | rlsim | published |", "|---|---|---|"]
    sync = next((r for r in rows if r["policy"] == "sync"), None)
    if sync:
        print(
            f"sync on {sync['requests']:,} requests: simulated epoch {sync['epoch_h']:.2f} h, rollout share "
            f"{sync['rollout_share']:.1%} (RollPacker 66-72%, RhymeRL 84-91%), first-done idle "
            f"{sync['first_done_idle_ratio']:.1%} (RhymeRL about 76%), bubble ratio {sync['bubble_ratio']:.1%}"
        )
        print(
            f"sync's driver, policy and records over a heap engine (no scheduler): {sync['floor_s']:.2f} s, "
            f"{sync['floor_s'] / sync['heap_loop_s']:.1f}x the heap loop; the engine's share of the epoch "
            f"{1 - sync['floor_s'] / sync['wall_s']:.0%}"
        )
        baseline += [
            f"| rollout share of step time | {sync['rollout_share']:.1%} "
            "| 66-72% (RollPacker Table 1), 84-91% (RhymeRL) |",
            f"| first instance to finish idles, share of the rollout phase | {sync['first_done_idle_ratio']:.1%} "
            "| about 76% (RhymeRL) |",
            f"| bubble ratio (idle instance-time / instances x rollout time) | {sync['bubble_ratio']:.1%} | |",
            f"| simulated epoch time ({sync['requests']:,} requests) | {sync['epoch_h']:.2f} h | |",
        ]  # fmt: skip
        floor = f"{sync['floor_s']:.2f} | {sync['heap_loop_s']:.2f} | {sync['floor_s'] / sync['heap_loop_s']:.1f}x"
        p = prior[rows.index(sync)]
        if p:
            f0, f1, h0, h1 = p["floor_s"], sync["floor_s"], p["heap_loop_s"], sync["heap_loop_s"]
            speed.append(f"| sync's driver, policy and records over `_HeapEngine` (the floor) | {f0:.2f} | {f1:.2f} | "
                         f"{f0 / f1:.2f}x | {h1:.2f} | {f0 / h0:.1f}x | {f1 / h1:.1f}x | | |")  # fmt: skip
        else:
            speed.append(f"| sync's driver, policy and records over `_HeapEngine` (the floor) | {floor} | |")

    trace = load(default_trace(), columns=[])
    sl, cl = RLConfig(max_steps=2), ClusterConfig(num_gpus=8)
    t0 = time.perf_counter()
    fast = simulate(trace, cluster=cl, rl=sl)
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    exact = simulate(trace, cluster=cl, rl=sl, exact=True)
    t_exact = time.perf_counter() - t0
    diff = abs(fast.summary["total_time_s"] / exact.summary["total_time_s"] - 1)
    print(
        f"fast vs --exact (2 steps, 8 GPUs): fast {t_fast:.2f} s, exact {t_exact:.2f} s, "
        f"makespan difference {diff:.1e} (target < 0.5%)"
    )
    baseline.append(f"| fast path vs `--exact` (2 steps, 8 GPUs) | makespan difference {diff:.0e} | |")
    if b:
        other = ["| command | before (s) | after (s) | speed-up | target (s) |", "|---|---|---|---|---|"]
    else:
        other = ["| command | wall (s) | target (s) |", "|---|---|---|"]

    def row(label: str, was: float | None, now: float, target: str, digits: int = 1) -> str:
        if not b:
            return f"| {label} | {now:.{digits}f} | {target} |"
        if was is None:  # a figure the revision before does not give
            return f"| {label} | | {now:.{digits}f} | | {target} |"
        return f"| {label} | {was:.{digits}f} | {now:.{digits}f} | {was / now:.2f}x | {target} |"

    if not a.skip_cli:
        cli = [sys.executable, "-m", "rlsim.cli"]
        for label, args, target in (
            (f"`rlsim compare` (defaults: {len(COMPARE_DEFAULT)} policies, 2 epochs)", ["compare"], "15"),
            ("`rlsim plan --target-epoch-hours 3.4 --no-cache`", ["plan", "--target-epoch-hours", "3.4", "--no-cache"],
             "10"),
        ):  # fmt: skip
            was = _wall([*cli, *args], before) if b else None
            t = _wall([*cli, *args])
            was_s = "" if was is None else f"before {was:.1f} s, "
            print(f"rlsim {' '.join(args)}: {was_s}{t:.1f} s (target {target} s)")
            other.append(row(label, was, t, target))
    if a.big:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "math17k_x10.parquet")
            subprocess.run([sys.executable, __file__, "--write-big", path], check=True)
            p = _child(["--big-child", path], before) if b else None
            r = _child(["--big-child", path])
        rate = r["requests"] / r["wall_s"]
        print(
            f"10x trace, one sync epoch: {r['requests']:,} requests in {r['wall_s']:.1f} s ({rate:,.0f} requests/s), "
            f"peak {r['peak_mib']:.0f} MiB{'' if p is None else ' (before ' + str(round(p['wall_s'], 1)) + ' s)'}"
            " (targets 15 s, 2 GiB)"
        )
        peak = f"peak {r['peak_mib']:,.0f} MiB"
        if p is not None:
            peak = f"peak {p['peak_mib']:,.0f} then {r['peak_mib']:,.0f} MiB"
        other.append(row(f"one sync epoch of the 10x trace ({r['requests']:,} requests, {peak})",
                         None if p is None else p["wall_s"], r["wall_s"], "15 (and 2,048 MiB)"))  # fmt: skip
        if sync:
            print(f"bundled trace, one sync epoch: {sync['requests'] / sync['wall_s']:,.0f} requests/s")
            # linear: the 10x epoch's simulation within 10x the bundled epoch's, both timed alike
            # (the simulation alone, each in a fresh process); a revision that did not time it alone
            # gives no figure
            scale = r["requests"] / sync["requests"]

            def linear(big_run: dict | None, one_run: dict | None) -> float | None:
                if not big_run or not one_run or "sim_s" not in big_run:
                    return None
                return big_run["sim_s"] / (scale * one_run["wall_s"])

            lin, was_lin = linear(r, sync), linear(p, prior[rows.index(sync)])
            print(f"10x trace against {scale:.0f}x the bundled epoch (simulation alone): {lin:.2f} (target <= 1)")
            other.append(row(f"the 10x epoch's simulation over {scale:.0f}x the bundled one's (a ratio; linear: <= 1)",
                             was_lin, lin, "1.00", digits=2))  # fmt: skip
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    script = "simulate_epoch.py" + (" --big" if a.big else "") + (f" --before {a.before}" if b else "")
    note = machine_note(meter, script)
    if sync:
        emit("sync_baseline", "\n".join(baseline) + "\n\n" + note, sys.argv)
    if len(other) > 2:
        speed += ["", *other]
    emit("simulator_speed", "\n".join(speed) + "\n\n" + note, sys.argv)


if __name__ == "__main__":
    main()
