"""How long `rlsim compare` takes under SGLang's rules against vLLM's, side by side.

    python benchmarks/engine_speed.py [--markdown | --readme]

`rlsim compare` on the bundled default, the same policies under each engine (those that do not
speculate: speculative decoding is modelled under vLLM's rules only), one command after the
other on this machine, each a fresh process as a user runs it: vLLM's rules on the compiled core,
SGLang's on SimEngine (not compiled). The two run in turn, three rounds (vLLM, SGLang, vLLM, ...),
so a drift in the machine's speed lands on both; the ratio is the mean of the pairs' ratios, each
pair's given beside it. The target is SGLang's at most 3x vLLM's compiled time.
Writes the table `engine_speed` into docs/simulate.md with the machine and its load.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from readme_tables import emit, machine_note

from policies.registry import COMPARE_DEFAULT, parse_policy
from rlsim.hostload import LoadMeter

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 3  # vLLM then SGLang, three times: each pair's ratio is measured side by side


def timed_compare(engine: str, policies: list[str]) -> float:
    """Seconds of one `rlsim compare --rollout-engine ENGINE --policies ...` process."""
    cmd = [sys.executable, "-m", "rlsim.cli", "compare", "--rollout-engine", engine, "--policies", ",".join(policies),
           "--markdown"]  # fmt: skip
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    took = time.perf_counter() - t0
    if out.returncode:
        sys.exit(f"{' '.join(cmd[1:])} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return took


def main() -> int:
    argv = sys.argv[1:]
    policies = [p for p in COMPARE_DEFAULT if parse_policy(p).histospec is None]
    meter = LoadMeter()
    secs: dict[str, list[float]] = {"vllm": [], "sglang": []}
    for _ in range(ROUNDS):
        for engine in ("vllm", "sglang"):
            secs[engine].append(timed_compare(engine, policies))
            print(f"{engine}: {secs[engine][-1]:.1f} s", file=sys.stderr, flush=True)
    note = machine_note(meter, "engine_speed.py")
    ratios = [s / v for v, s in zip(secs["vllm"], secs["sglang"], strict=True)]
    ratio = sum(ratios) / len(ratios)
    v_s, s_s = (", ".join(f"{x:.1f}" for x in secs[e]) for e in ("vllm", "sglang"))
    verdict = "met" if ratio <= 3.0 else "missed"
    rows = [
        "| `rlsim compare` on the bundled default | rules run by | seconds (each round) | against vLLM's |",
        "|---|---|---|---|",
        f"| `--rollout-engine vllm` | the compiled core | {v_s} | 1.00x |",
        f"| `--rollout-engine sglang` | SimEngine | {s_s} | {ratio:.2f}x ({', '.join(f'{r:.2f}x' for r in ratios)}; "
        f"target at most 3x: {verdict}) |",
        "",
        f"The same {len(policies)} policies under both ({', '.join(policies)}), one process each, the two engines in "
        f"turn, {ROUNDS} rounds. {note}",
    ]
    emit("engine_speed", "\n".join(rows), argv)
    if not {"--markdown", "--readme"} & set(argv):
        print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
