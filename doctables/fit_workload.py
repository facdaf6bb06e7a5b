"""Bring your own workload, measured: a real log, the generator fitted to it, and a shipped preset.

For each real log under tests/data/ (the rLLM DeepCoder-14B log: 5 steps x 16 prompts x 8 at a
16,000-token cap; the verl DAPO log: 6 steps x 96 prompts x 8), prints

1. the length statistics of the log against the fitted generator, in sample and 5-fold
   cross-validated (each fold's prompts against a fit to the other folds);
2. every registered policy's speedup over sync on the real log, on the fitted generator (mean
   and standard deviation of DRAWS synthetic traces shaped like the log) and on the shipped
   `dapo-qwen2.5-32b` preset at the same shape and cap (what a user got before fitting).

Usage: python -m doctables.fit_workload [DRAWS] [--markdown | --readme]   (default 40, as tests/test_fit.py;
about 2 minutes on 2 cores). `--markdown` prints the coder log's two tables as docs/simulate.md shows them,
`--readme` also writes them there (`tests/test_readme_tables.py` holds them equal, among the checks
too long for CI, `.ci/long`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import numpy as np

from policies.registry import REGISTRY
from rlsim.config import ClusterConfig, RLConfig
from rlsim.package_data.markers import emit
from rlsim.sim.compare import compare
from rlsim.trace.fit import cross_validate, fit_preset
from rlsim.trace.fit_check import check_fit
from rlsim.trace.importers import import_logs
from rlsim.trace.synth import SynthConfig, synthesize

# colocated here: fully_async and areal run disaggregated, and k_step_off at its default k is one_step_off
FITTED = [n for n in REGISTRY if not hasattr(REGISTRY[n], "placement") and n != "k_step_off"]

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
LOGS = (
    ("rLLM DeepCoder-14B", DATA / "polytrace_rllm_deepcoder", None, 16, 8, "h100-qwen2.5-14b-tp2"),
    ("verl DAPO Qwen2.5-32B", DATA / "polytrace_verl_dapo_qwen2.5", 20480, 96, 32, "h100-qwen2.5-32b-tp4"),
)


def speedups(trace, cluster, rl) -> dict[str, float]:  # noqa: ANN001
    return {r["policy"]: r["speedup_vs_sync"] for r in compare(trace, FITTED, cluster, rl, workers=1)}


def drawn(preset_or_name, like, rl, cluster, draws: int) -> dict[str, np.ndarray]:  # noqa: ANN001
    out: dict[str, list[float]] = {n: [] for n in FITTED}
    for seed in range(draws):
        cfg = SynthConfig(
            preset=preset_or_name if isinstance(preset_or_name, str) else "dapo-qwen2.5-32b",
            num_prompts=like.num_prompts, samples_per_prompt=like.meta.samples_per_prompt, epochs=1,
            prompts_per_step=rl.prompts_per_step, max_response_len=like.meta.max_response_len, seed=seed,
        )  # fmt: skip
        preset = None if isinstance(preset_or_name, str) else preset_or_name
        for name, s in speedups(synthesize(cfg, preset=preset), cluster, rl).items():
            out[name].append(s)
    return {k: np.array(v) for k, v in out.items()}


def main(draws: int = 40, markdown: bool = False) -> None:
    """The report on stdout; with `markdown`, on stderr, and docs/simulate.md's tables on stdout."""
    with contextlib.redirect_stdout(sys.stderr if markdown else sys.stdout):
        tables = report(draws)
    if markdown:
        readme_tables(*tables)


def report(draws: int) -> tuple:
    t0 = time.perf_counter()
    tables = ()
    for label, path, cap, per_step, gpus, profile in LOGS:
        trace = import_logs(path, max_response_len=cap).trace
        preset, notes = fit_preset(trace, label)
        shape = f"{trace.num_prompts} prompts x {trace.meta.samples_per_prompt}, cap {trace.meta.max_response_len:,}"
        print(f"\n== {label}: {shape}")
        print("   " + next(n for n in notes if n.startswith("form")))
        ins = {r["metric"]: r for r in check_fit(preset, trace)}
        cv = {r["metric"]: r for r in cross_validate(trace, label, 5, 0)}
        print(f"   {'metric':22s}{'log':>10s}{'fitted':>10s}{'diff':>9s}{'5-fold CV':>11s}")
        for m, r in ins.items():
            a = "-" if r["a"] is None else (f"{r['a']:.3f}" if abs(r["a"]) < 2 else f"{r['a']:,.0f}")
            b = f"{r['b']:.3f}" if abs(r["b"]) < 2 else f"{r['b']:,.0f}"
            print(f"   {m:22s}{a:>10s}{b:>10s}{r['diff']:>9s}{cv[m]['diff']:>11s}")
        cluster = ClusterConfig(num_gpus=gpus, profile=profile)
        rl = RLConfig(
            prompts_per_step=per_step, samples_per_prompt=trace.meta.samples_per_prompt, epochs=1,
            max_response_len=trace.meta.max_response_len,
        )  # fmt: skip
        real = speedups(trace, cluster, rl)
        fitted = drawn(preset, trace, rl, cluster, draws)
        shipped = drawn("dapo-qwen2.5-32b", trace, rl, cluster, max(4, draws // 4))
        print(f"   speedup over sync, {gpus} GPUs {profile}, P0={per_step}:")
        print(
            f"   {'policy':16s}{'real log':>10s}{'fitted (mean +- sd)':>22s}{'pts':>7s}{'dapo preset':>13s}{'pts':>7s}"
        )
        for n in FITTED:
            f, d = fitted[n], shipped[n]
            print(
                f"   {n:16s}{real[n]:>10.3f}{f.mean():>14.3f} +- {f.std(ddof=1):.3f}"
                f"{100 * (f.mean() - real[n]):>+7.1f}{d.mean():>13.3f}{100 * (d.mean() - real[n]):>+7.1f}"
            )
        if "DeepCoder" in label:
            tables = (trace, ins, cv, real, fitted, shipped, gpus, per_step)
    print(f"\n{time.perf_counter() - t0:.0f} s")
    return tables


def readme_tables(trace, ins, cv, real, fitted, shipped, gpus: int, per_step: int) -> None:  # noqa: ANN001
    """The coder log's statistics and speedups as docs/simulate.md's two tables."""
    n_resp = trace.num_prompts * trace.meta.samples_per_prompt
    rows = [f"| rLLM 14B coder log, {n_resp:,} responses | log | fitted | in sample | 5-fold CV |", "|---" * 5 + "|"]
    for m, r in ins.items():
        a = "" if r["a"] is None else (f"{r['a']:.3f}" if abs(r["a"]) < 2 else f"{r['a']:,.0f}")
        b = f"{r['b']:.3f}" if abs(r["b"]) < 2 else f"{r['b']:,.0f}"
        rows.append(f"| {m} | {a} | {b} | {r['diff']} | {cv[m]['diff']} |")
    emit("fit_coder_metrics", "\n".join(rows), sys.argv)
    shape = f"{gpus} H100, Qwen2.5-14B TP 2, P0 {per_step}, R0 {trace.meta.samples_per_prompt}"
    rows = [f"| speedup over sync ({shape}) | real log | fitted (mean +- sd) | points | `dapo-qwen2.5-32b` preset | "
            "points |", "|---" * 6 + "|"]  # fmt: skip
    for n in FITTED:
        if n == "sync":
            continue
        f, d = fitted[n], shipped[n]
        pts, pts_d = 100 * (f.mean() - real[n]), 100 * (d.mean() - real[n])
        fit = f"{f.mean():.3f} +- {f.std(ddof=1):.3f}"
        rows.append(f"| {n} | {real[n]:.3f} | {fit} | {pts:+.1f} | {d.mean():.3f} | {pts_d:+.1f} |")
    emit("fit_coder_speedups", "\n".join(rows), sys.argv)


if __name__ == "__main__":
    numbers = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(int(numbers[0]) if numbers else 40, markdown="--markdown" in sys.argv or "--readme" in sys.argv)
