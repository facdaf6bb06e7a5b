"""The whole SGLang parity grid: rlsim's SGLang rules against SGLang's own `Scheduler`.

Each workload of `rlsim.sim.sglang_parity.GRID` runs under SGLang's normal loop and its overlap
loop, on both sides; a row says whether every iteration (the requests a prefill extends and by how
many tokens, or how many a decode runs, and who was retracted first) and every finish iteration
were equal, and what the run exercised. SGLang runs in its own environment (`.ci/sglang-env`):

    bash .ci/sglang-env .sglang-venv
    RLSIM_SGLANG_PYTHON=.sglang-venv/bin/python python benchmarks/sglang_parity.py [--markdown]

`--markdown` prints the table docs/simulate.md holds, `--readme` writes it there. `--compiled` runs
rlsim's side on the compiled core's rules (`rlsim.sim.compiled.sglang`, what `simulate` runs),
every row. CI runs a subset
(tests/test_sglang_parity.py, both rlsim sides against SGLang's).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import time

from rlsim.package_data.markers import emit
from rlsim.sim.sglang_parity import GRID, counts, first_difference, run_rlsim, run_sglang
from rlsim.sim.sglang_scheduler import SGLANG_VERSION


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--readme", action="store_true", help="write the table into docs/simulate.md")
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--compiled", action="store_true", help="rlsim's side on the compiled core's rules")
    args = ap.parse_args()
    names = [n for n in GRID if not args.only or n in args.only.split(",")]
    rows = []
    for name in names:
        for overlap in (False, True):
            cfg = dataclasses.replace(GRID[name], overlap=overlap)
            t0 = time.perf_counter()
            ours = run_rlsim(cfg, compiled=args.compiled)
            t1 = time.perf_counter()
            theirs = run_sglang(cfg, timeout_s=3600)
            t2 = time.perf_counter()
            diff = first_difference(ours, theirs)
            c = counts(theirs)
            rows.append((name, "overlap" if overlap else "normal", cfg.num_prompts * cfg.samples_per_prompt,
                         cfg.kv_tokens, cfg.page_size, c, diff, t1 - t0, t2 - t1))  # fmt: skip
            print(f"{name} ({rows[-1][1]}): {'equal' if diff is None else diff}", flush=True)
    load = os.getloadavg()[0]
    ours_are = "the compiled core's rules" if args.compiled else "`SGLangScheduler`"
    head = (f"sglang {SGLANG_VERSION} `Scheduler` against rlsim's {ours_are} (event jumps), "
            f"{platform.machine()} CPU, {os.cpu_count()} cores, load {load:.1f}")  # fmt: skip
    lines = [
        head, "",
        "| workload | loop | requests | KV tokens | page | iterations | prefills | retractions | finished | equal "
        "| rlsim s | SGLang s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]  # fmt: skip
    for name, loop, n, kv, page, c, diff, t_ours, t_theirs in rows:
        lines.append(
            f"| {name} | {loop} | {n:,} | {kv:,} | {page} | {c['iterations']:,} | {c['prefills']:,} | "
            f"{c['retractions']:,} | {c['finished']:,} | {'yes' if diff is None else 'no: ' + diff[:60]} | "
            f"{t_ours:.2f} | {t_theirs:.0f} |"
        )
    body = "\n".join([*lines[2:], "", f"Written by `python benchmarks/sglang_parity.py --readme`: {head}; the "
                      "seconds are each side's run (SGLang's includes its 15 s start)."])
    if args.markdown or args.readme:
        emit("sglang_parity", body, ["--readme"] if args.readme else ["--markdown"])
    else:
        print("\n".join(lines[:1] + lines[2:]))


if __name__ == "__main__":
    main()
