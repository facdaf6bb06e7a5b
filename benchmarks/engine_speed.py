"""How long `rlsim compare` takes under SGLang's rules against vLLM's, side by side.

    python benchmarks/engine_speed.py [--markdown | --readme]

`rlsim compare` on the bundled default, the same policies under each engine (those that do not
speculate: speculative decoding is modelled under vLLM's rules only), one command after the
other on this machine, each a fresh process as a user runs it, both engines' rules on the compiled
core. The two run in turn, three rounds (vLLM, SGLang, vLLM, ...), so a drift in the machine's
speed lands on both; the ratio is the mean of the pairs' ratios, each pair's given beside it. The
target is SGLang's at most 1.3x vLLM's time. Beside the wall
seconds, the processor seconds each command used (its pool's workers included, from the
operating system's accounting of the finished process): time another tenant of a shared machine
takes from it does not count there, so that ratio moves less between rounds.
Writes the table `engine_speed` into docs/simulate.md with the machine and its load.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

from policies.registry import COMPARE_DEFAULT, parse_policy
from rlsim.hostload import LoadMeter
from rlsim.package_data.markers import emit, machine_note

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 3  # vLLM then SGLang, three times: each pair's ratio is measured side by side
TARGET = 1.3  # SGLang's time at most this times vLLM's


def _children_cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def timed_compare(engine: str, policies: list[str]) -> tuple[float, float]:
    """(Wall seconds, processor seconds) of one `rlsim compare --rollout-engine ENGINE --policies ...`
    process; the processor seconds count its workers too (each reaped by it before it exits)."""
    cmd = [sys.executable, "-m", "rlsim.cli", "compare", "--rollout-engine", engine, "--policies", ",".join(policies),
           "--markdown"]  # fmt: skip
    cpu0, t0 = _children_cpu_s(), time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    took, cpu = time.perf_counter() - t0, _children_cpu_s() - cpu0
    if out.returncode:
        sys.exit(f"{' '.join(cmd[1:])} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return took, cpu


def main() -> int:
    argv = sys.argv[1:]
    policies = [p for p in COMPARE_DEFAULT if parse_policy(p).histospec is None]
    meter = LoadMeter()
    secs: dict[str, list[float]] = {"vllm": [], "sglang": []}
    cpus: dict[str, list[float]] = {"vllm": [], "sglang": []}
    for _ in range(ROUNDS):
        for engine in ("vllm", "sglang"):
            wall, cpu = timed_compare(engine, policies)
            secs[engine].append(wall)
            cpus[engine].append(cpu)
            print(f"{engine}: {wall:.1f} s ({cpu:.1f} processor s)", file=sys.stderr, flush=True)
    note = machine_note(meter, "engine_speed.py")

    def against(of: dict[str, list[float]]) -> tuple[float, str]:
        ratios = [s / v for v, s in zip(of["vllm"], of["sglang"], strict=True)]
        return sum(ratios) / len(ratios), ", ".join(f"{r:.2f}x" for r in ratios)

    ratio, pairs = against(secs)
    cpu_ratio, cpu_pairs = against(cpus)
    v_s, s_s = (", ".join(f"{x:.1f}" for x in secs[e]) for e in ("vllm", "sglang"))
    v_c, s_c = (", ".join(f"{x:.1f}" for x in cpus[e]) for e in ("vllm", "sglang"))
    verdict = "met" if ratio <= TARGET else "missed"
    rows = [
        "| `rlsim compare` on the bundled default | rules run by | wall seconds (each round) | against vLLM's "
        "| processor seconds (each round) | against vLLM's |",
        "|---|---|---|---|---|---|",
        f"| `--rollout-engine vllm` | the compiled core | {v_s} | 1.00x | {v_c} | 1.00x |",
        f"| `--rollout-engine sglang` | the compiled core | {s_s} | {ratio:.2f}x ({pairs}; target at most "
        f"{TARGET}x: {verdict}) "
        f"| {s_c} | {cpu_ratio:.2f}x ({cpu_pairs}) |",
        "",
        f"The same {len(policies)} policies under both ({', '.join(policies)}), one process each, the two engines in "
        f"turn, {ROUNDS} rounds; each ratio is the mean of the rounds' (each round's in brackets). {note}",
    ]
    emit("engine_speed", "\n".join(rows), argv)
    if not {"--markdown", "--readme"} & set(argv):
        print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
