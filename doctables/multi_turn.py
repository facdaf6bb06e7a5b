"""Multi-turn rollouts against the Search-R1 log (PolyTrace, `traces/search_r1.parquet`).

    python -m doctables.multi_turn [--markdown | --readme] [--write-preset]

1. `search_r1_fit`: the multi-turn generator fitted on the log's steps 0-2 (the fitting set) and
   tested on steps 3-4 (held out): trajectory shape of a generated trace against both.
   `--write-preset` writes the fit as the shipped preset `search-r1`
   (rlsim/trace/turn_presets/search-r1.json); CI holds the shipped file equal to the fit.
2. `search_r1_sim`: `sync` in the log's setup (8 GPUs of Qwen2.5-7B, 256 prompts x 8 samples a
   step, the log's cap and model length), on the logged steps 3-4 and on a generated trace of the
   same size: later turns' prefix hit rate and per-turn engine latency beside the log's. Nothing
   here is fitted to the log's latencies or hit rates: they are predictions, or references.
3. `tool_latency_sweep`: every tool call set to 0.1 s to 60 s on the logged steps 3-4: where the
   tool waits start to dominate a step.
4. `search_r1_compare`: `rlsim compare` on the whole trace in the same setup.
5. `search_r1_engines`: `sync` on the logged steps 3-4 under vLLM's rules and under SGLang's (the
   log's engine): the later turns' prefix hit rate under 16-token blocks and one-token pages.

Assumptions (the log does not record them): H100-80GB GPUs, one GPU per rollout instance (TP 1),
vLLM's block-granular prefix cache (the log ran SGLang, whose radix cache is token-granular), and
tool calls that start at once (the log's latencies already hold the search server's queueing).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.driver.turns import ToolConfig
from rlsim.package_data.markers import emit
from rlsim.sim.simulate import simulate
from rlsim.trace.format import Trace, load
from rlsim.trace.import_polytrace_turns import turn_log
from rlsim.trace.turn_model import PRESET_DIR, fit, save_model, synthesize, trajectory_stats

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "traces" / "search_r1.parquet"
LOG = REPO.parent / "shared" / "data" / "polytrace" / "search_r1_multiturn_0617_0223"
FIT_STEPS, TEST_STEPS = (0, 1, 2), (3, 4)
SETUP = dict(num_gpus=8, profile="h100-qwen2.5-7b-tp1")
SWEEP = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 60.0)


def steps(trace: Trace, which: tuple[int, ...]) -> Trace:
    return Trace(trace.table[trace.table["step"].isin(which)].reset_index(drop=True), trace.meta)


def fitted() -> tuple[Trace, Trace, Trace, object]:
    trace = load(TRACE)
    fit_set, test_set = steps(trace, FIT_STEPS), steps(trace, TEST_STEPS)
    model = fit(fit_set, "search-r1")
    generated = synthesize(model, int(test_set.table["prompt_id"].nunique()), trace.meta.samples_per_prompt, 1, 0)
    return fit_set, test_set, generated, model


def fit_table(fit_set: Trace, test_set: Trace, generated: Trace) -> str:
    a, b, c = (trajectory_stats(t) for t in (fit_set, test_set, generated))
    lines = ["| metric | fitting set (steps 0-2) | held out (steps 3-4) | generated | error vs fitting set (fit) "
             "| error vs held out (test) |", "|---|---|---|---|---|---|"]  # fmt: skip
    for k in a:
        lines.append(f"| {k} | {a[k]:,.2f} | {b[k]:,.2f} | {c[k]:,.2f} | {100 * (c[k] / a[k] - 1):+.1f}% "
                     f"| {100 * (c[k] / b[k] - 1):+.1f}% |")
    return "\n".join(lines)


def run(trace: Trace, policy: str = "sync", tools: ToolConfig | None = None, rollout_engine: str = "vllm") -> dict:
    rl = RLConfig(prompts_per_step=256, samples_per_prompt=8, max_response_len=trace.meta.max_response_len, epochs=1)
    engine = EngineConfig(rollout_engine=rollout_engine)
    return simulate(trace, policy, ClusterConfig(**SETUP), rl, tables=False, tools=tools, engine_cfg=engine).summary


def log_reference() -> dict:
    """The log's later-turn hit rate and per-turn engine latency, steps 3-4 (from the raw log when it
    is beside the checkout, else the figures it gave when this table was written)."""
    if not LOG.is_dir():
        return {}
    d = turn_log(LOG)
    d = d[d["step"].isin(TEST_STEPS)]
    later = d[d["turn"] > 0]
    return {"hit": later["cached_tokens"].sum() / later["prompt_tokens"].sum(),
            "lat": float(d["engine_latency_s"].median()),
            "lat_by_turn": [float(d.loc[d["turn"] == k, "engine_latency_s"].median()) for k in range(3)]}  # fmt: skip


def sim_table(test_set: Trace, generated: Trace) -> str:
    real, gen, ref = run(test_set), run(generated), log_reference()
    mr, mg = real["multi_turn"], gen["multi_turn"]

    def log(key: str, fmt: str) -> str:
        return format(ref[key], fmt) if key in ref else "(log not beside the checkout)"

    rows = [
        ("step time (s)", "not logged", f"{real['total_time_s'] / 2:.1f}", f"{gen['total_time_s'] / 2:.1f}"),
        ("later turns' prefix hit rate", log("hit", ".1%"), f"{mr['turn_prefix_hit_rate']:.1%}",
         f"{mg['turn_prefix_hit_rate']:.1%}"),
        ("tokens prefilled again (evicted or partial blocks)", "not logged", f"{mr['reprefilled_tokens']:,}",
         f"{mg['reprefilled_tokens']:,}"),
        ("turns per trajectory", f"{trajectory_stats(test_set)['turns per trajectory']:.2f}",
         f"{mr['turns_per_trajectory']:.2f}", f"{mg['turns_per_trajectory']:.2f}"),
        ("tool wait share of trajectory time", "not logged", f"{mr['tool_wait_share']:.1%}",
         f"{mg['tool_wait_share']:.1%}"),
        ("per-turn engine latency p50 (s), reference", log("lat", ".1f"), f"{mr['turn_latency_p50_s']:.2f}",
         f"{mg['turn_latency_p50_s']:.2f}"),
    ]  # fmt: skip
    lines = ["| figure | the log (steps 3-4) | simulated, logged steps 3-4 | simulated, generated trace |",
             "|---|---|---|---|"]  # fmt: skip
    return "\n".join(lines + [f"| {' | '.join(r)} |" for r in rows])


def sweep_table(test_set: Trace) -> str:
    lines = ["| tool latency (s) | sync step (s) | sync tool wait | sync GPU idle in tools | async_partial step (s) "
             "| async_partial tool wait | async_partial GPU idle in tools |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for lat in SWEEP:
        cells = [f"{lat:g}"]
        for policy in ("sync", "async_partial"):
            s = run(test_set, policy, ToolConfig(tool_latency_s=lat))
            m = s["multi_turn"]
            cells += [f"{s['total_time_s'] / 2:.1f}", f"{m['tool_wait_share']:.0%}",
                      f"{m['gpu_idle_during_tools_ratio']:.1%}"]  # fmt: skip
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def engines_table(test_set: Trace) -> str:
    """`sync` on the logged steps 3-4 under vLLM's rules (16-token blocks) and SGLang's (the log's
    engine, one-token pages): the later turns' prefix hits, a prediction under both."""
    ref = log_reference()
    v, g = run(test_set), run(test_set, rollout_engine="sglang")
    mv, mg = v["multi_turn"], g["multi_turn"]
    hit = format(ref["hit"], ".1%") if "hit" in ref else "(log not beside the checkout)"
    lat = format(ref["lat"], ".1f") if "lat" in ref else "(log not beside the checkout)"
    rows = [
        ("later turns' prefix hit rate", hit, f"{mv['turn_prefix_hit_rate']:.1%}", f"{mg['turn_prefix_hit_rate']:.1%}"),
        ("tokens prefilled again (evicted or partial blocks)", "not logged", f"{mv['reprefilled_tokens']:,}",
         f"{mg['reprefilled_tokens']:,}"),
        ("requests preempted or retracted", "not logged", f"{v['preemptions']:,}", f"{g['preemptions']:,}"),
        ("step time (s)", "not logged", f"{v['total_time_s'] / 2:.1f}", f"{g['total_time_s'] / 2:.1f}"),
        ("per-turn engine latency p50 (s), reference", lat, f"{mv['turn_latency_p50_s']:.2f}",
         f"{mg['turn_latency_p50_s']:.2f}"),
    ]  # fmt: skip
    lines = ["| figure | the log (SGLang, steps 3-4) | vLLM's rules (16-token blocks) "
             "| SGLang's rules (1-token pages) |", "|---|---|---|---|"]  # fmt: skip
    return "\n".join(lines + [f"| {' | '.join(r)} |" for r in rows])


def compare_table() -> str:
    out = subprocess.run(
        [sys.executable, "-m", "rlsim.cli", "compare", "--trace", str(TRACE), "--profile", SETUP["profile"], "--gpus",
         str(SETUP["num_gpus"]), "--markdown"], cwd=REPO, capture_output=True, text=True, check=True, timeout=900,
    )  # fmt: skip
    return out.stdout.strip()


def main(argv: list[str]) -> None:
    fit_set, test_set, generated, model = fitted()
    if "--write-preset" in argv:
        save_model(model, PRESET_DIR / "search-r1.json")
    emit("search_r1_fit", fit_table(fit_set, test_set, generated), argv)
    emit("search_r1_sim", sim_table(test_set, generated), argv)
    emit("tool_latency_sweep", sweep_table(test_set), argv)
    emit("search_r1_engines", engines_table(test_set), argv)
    emit("search_r1_compare", compare_table(), argv)
    if not {"--markdown", "--readme"} & set(argv):
        print(np.round(model.turn_count_p, 3))


if __name__ == "__main__":
    main(sys.argv[1:])
