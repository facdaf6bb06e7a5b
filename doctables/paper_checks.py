"""Reproduction report: each policy against its paper's published numbers (docs/policies.md).

    python -m doctables.paper_checks [--markdown | --readme]

Each check runs rlsim on a trace and profile configured like the paper's setup as far as
the paper publishes it, and prints: check, paper figure, rlsim figure, pass/fail within the stated
tolerance. Setups:
- RollPacker, APRIL and Seer: in their setups of record (docs/policies.md, setups of record), as
  `doctables/paper_setups.py` states them: derived profiles of each paper's model on its GPUs at
  its rollout TP, with the framework terms fitted on NeMo RL's runs, except RollPacker's, which runs
  on ROLL: ROLL's setting is the derived profile with no term (no published ROLL run supports
  one), stated before the run, NeMo RL's terms shown beside it. RollPacker's trace is the
  `dapo-qwen2.5-32b` preset shaped like the paper's workload (`rollpacker_trace`): lengths of step
  2000 of the DAPO run (mean about 2.5k tokens, DAPO Fig. 7a); `prompt_share` 0.9 because the
  paper finds hard prompts stay long (eta_r alone barely helps); `clip_ratio` 0.01 because its
  baselines grow in proportion to the cap (82/277/673 s at 8/16/32k), so capped responses occur
  in every step.
- SortedRL (8k cap, group 512 x 8, updates of 1,024 trajectories; LLaMA-3.1-8B on H100): the
  7B TP 1 H100 profile on 8 GPUs, the bundled trace capped at 8k, 32 updates; both bubble
  definitions reported, the paper's figure held against the closer one (docs/policies.md, bands of record).
- HistoSpec (Qwen3-14B base, DAPO, 8k, 32 H100, batch 256, n = 16): the `dapo-qwen2.5-32b`
  preset at an 8k cap, Qwen2.5-14B TP2 profile, 32 GPUs, 256 prompts x 16, two epochs.
- HistoPipe: the `reasoning-32k` preset (whose prompts keep their lengths across epochs, as
  RhymeRL observes), 32k, 64 GPUs, 128 prompts x 16, two epochs. Tier 1 against the per-sample
  least-loaded baseline has no published figure (docs/policies.md, bands of record): it is reported, not
  judged, as is tier 2 (a reconstruction). The paper's 1.43x is held against the RhymeRL
  configuration: one-step off-policy overlap on separate rollout and training GPUs (32 + 32:
  the paper's split is not published) against `sync` on the same placement.
- Uniform lengths: every response 1,500 tokens, 40 instances with one prompt each, 16 steps per
  epoch (HistoPipe's second tier trains an epoch's held-back tail in one extra short step).

Checks are counted by kind. A **reproduction** holds a published figure to its band of record
(docs/policies.md, bands of record); an **invariant** is a property any correct implementation has whatever the
paper measured (RollPacker's round pattern, a short round's length bias below 0.95, SortedRL's
on-policy staleness 0 and partial-mode staleness at most 4, HistoSpec's 1.00x on a first visit);
a **reported** figure has no band. The two counts are printed apart, and the exit code is the number
of failed reproductions and broken invariants.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from doctables.paper_setups import SEER, april, describe_bars, rollpacker_figure11, seer
from policies.registry import REGISTRY
from rlsim.config import ClusterConfig, RLConfig
from rlsim.package_data.markers import emit
from rlsim.paths import default_trace
from rlsim.sim.simulate import simulate
from rlsim.trace.format import Trace, TraceMeta, load
from rlsim.trace.synth import SynthConfig, synthesize

ROWS: list[tuple[str, str, str, bool | None, str]] = []
RESULT = {True: "pass", False: "FAIL", None: "reported"}
KINDS = ("reproduction", "invariant", "reported")


def check(name: str, paper: str, value: str, ok: bool | None, kind: str = "reproduction") -> None:
    """One row; `ok=None` reports a figure that has no band to hold it to; `kind="invariant"`
    marks a property of any correct implementation, not a paper's figure."""
    kind = "reported" if ok is None else kind
    ROWS.append((name, paper, value, None if ok is None else bool(ok), kind))
    print(f"  {RESULT[ROWS[-1][3]].upper()}  {name}: {value} (paper: {paper})", file=sys.stderr, flush=True)


def rollpacker_trace(periods: int) -> Trace:
    """The `dapo-qwen2.5-32b` preset shaped like RollPacker's workload (the module docstring)."""
    return synthesize(
        SynthConfig(
            preset="dapo-qwen2.5-32b", num_prompts=periods * 4 * 160, samples_per_prompt=10, epochs=1, seed=0,
            max_response_len=32768, start_step=2000, prompt_share=0.9, clip_ratio=0.01,
        )
    )  # fmt: skip


def rollpacker_checks() -> None:
    """RollPacker in its setup of record (docs/policies.md, setups of record; `paper_setups`): Figure 11's bars, the
    both-factors gain over eta = 1.0, each factor alone, and tail batching end to end over veRL."""
    periods = 6
    tr = rollpacker_trace(periods)
    paper_both = {  # cap: eta 1.0 s, both 1.25 s, ratio band, end to end over veRL
        32768: (673, 170, (3.0, 5.0), 2.21), 16384: (277, 88, (2.3, 3.9), 1.48), 8192: (82, 47, (1.3, 2.2), 1.30),
    }
    for row in rollpacker_figure11(tr, periods):
        cap, k = row["cap"], row["cap"] // 1024
        paper_base, paper_rp, (lo, hi), paper_e2e = paper_both[cap]
        where = f"{k}k, {row['model']} at TP {row['tp']} on {row['gpus']} H800s"
        bars = row["bars"]
        base, both = bars[(1.0, 1.0)], bars[(1.25, 1.25)]
        launched = row["both"].requests.groupby("step").size()
        kinds = "".join("L" if n == 128 * 8 else "S" for n in launched)
        if cap == 32768:
            check("RollPacker period with eta = 1.25", "4 short rounds then 1 long", f"rounds {kinds[:10]}...",
                  kinds == "SSSSL" * periods, kind="invariant")  # fmt: skip
        check(
            f"RollPacker Figure 11 baseline (eta 1.0, longest short round), {where}",
            f"{paper_base} s (within 20%; its timer adds server start and reward workers)",
            f"{base:.0f} s ({base / paper_base - 1:+.0%}; ROLL's setting: derived, no term); with NeMo RL's "
            f"terms: {row['base_nemo']:.0f} s ({row['base_nemo'] / paper_base - 1:+.0%})",
            abs(base / paper_base - 1) <= 0.2,
        )
        check(
            f"RollPacker both factors 1.25 over eta 1.0, {where}",
            f"{paper_base} s -> {paper_rp} s, {paper_base / paper_rp:.2f}x ({lo}x-{hi}x)",
            f"{base:.0f} s -> {both:.0f} s, {base / both:.2f}x",
            lo <= base / both <= hi,
        )
        fixed_p, fixed_r = row["paper_p"], row["paper_r"]
        if cap > 8192:  # the paper's text gives each factor alone at 16k and 32k
            g, paper_g = base / bars[(1.0, 1.25)], fixed_p[0] / fixed_p[2]
            check(f"RollPacker eta_r alone (1.25), {where}", f"{paper_g:.2f}x (0.95x-1.30x)", f"{g:.2f}x",
                  0.95 <= g <= 1.30)  # fmt: skip
            g, paper_g = base / bars[(1.25, 1.0)], fixed_r[0] / fixed_r[2]
            check(f"RollPacker eta_p alone (1.25), {where}", f"{paper_g:.2f}x (within 25%)", f"{g:.2f}x",
                  abs(g / paper_g - 1) <= 0.25)  # fmt: skip
        paper, ours = describe_bars(row)
        check(f"RollPacker Figure 11, eta 1.0/1.125/1.25/1.5 with P or R fixed, {where}", paper, ours, None)
        sync, rp = row["sync"], row["both"]
        e2e = sync.summary["total_time_s"] / rp.summary["total_time_s"]
        check(
            f"RollPacker tail batching end to end over veRL, {where}",
            f"{paper_e2e:.2f}x (within 20%)",
            f"{e2e:.2f}x",
            abs(e2e / paper_e2e - 1) <= 0.2,
        )
        if cap == 32768:
            short = rp.steps[[c == "S" for c in kinds]]
            cut = sync.steps["response_length/max"].mean() / short["response_length/max"].mean()
            check("RollPacker short rounds cut the max response length", "up to 8.9x (4x-11x)", f"{cut:.1f}x",
                  4 <= cut <= 11)  # fmt: skip
            bias = short["trained_length_bias"].mean()
            check(
                "RollPacker short-round length bias is reported",
                "fastest R0 of eta_r x R0 kept",
                f"trained_length_bias {bias:.2f}",
                bias < 0.95,
                kind="invariant",
            )


def rollout_share_checks() -> None:
    """RollPacker Table 1 (Qwen2.5-14B, 16k, 32 H800, veRL): rollout is 66-72% of the step. On
    the bundled trace (first-step lengths) and on the DAPO-step-2000 workload of the checks above."""
    rl = RLConfig(prompts_per_step=128, samples_per_prompt=8, max_response_len=16384, max_steps=4, epochs=1)
    cl = ClusterConfig(num_gpus=32, profile="h800-qwen2.5-14b-tp2")
    paper_like = synthesize(
        SynthConfig(preset="dapo-qwen2.5-32b", num_prompts=4 * 128, samples_per_prompt=8, epochs=1, seed=0,
                    max_response_len=16384, start_step=2000, prompt_share=0.9, clip_ratio=0.01)
    )  # fmt: skip
    for label, trace in (("bundled trace", load(default_trace(), columns=[])), ("DAPO step 2000", paper_like)):
        res = simulate(trace, "sync", cl, rl)
        share = res.summary["rollout_share"]
        t = res.steps.mean(numeric_only=True)
        check(
            f"Rollout share of the step, 14B/16k/32 H800 ({label})",
            "66-72% (RollPacker Table 1)",
            f"{share:.0%} (rollout {t['timing_s/gen']:.0f} s, old log-prob + update "
            f"{t['timing_s/old_log_prob'] + t['timing_s/update_actor']:.0f} s)",
            0.66 <= share <= 0.72,
        )


def sortedrl_checks() -> None:
    """The paper's throughput run: 8k cap, group 512 prompts x 8, updates of 1,024
    trajectories (128 x 8), LLaMA-3.1-8B on one 8-GPU H100 node (the 7B TP 1 H100 profile is
    the nearest shipped one), against a synchronous baseline training the same 128 x 8 per
    step. The workload is the bundled trace (its logic-puzzle lengths are not published)."""
    tr = load(default_trace(), columns=[])
    rl = RLConfig(prompts_per_step=128, samples_per_prompt=8, epochs=1, max_response_len=8192, max_steps=32)
    cl = ClusterConfig(num_gpus=8, profile="h100-qwen2.5-7b-tp1")
    runs = {
        "baseline": simulate(tr, "sync", cl, rl).summary,
        "on-policy": simulate(tr, "sortedrl(group=512)", cl, rl).summary,
        "partial": simulate(tr, "sortedrl(group=512,mode=partial)", cl, rl).summary,
    }
    bands = {"baseline": (0.74, 0.60, 0.85), "on-policy": (0.0581, 0.0, 0.15), "partial": (0.0337, 0.0, 0.10)}
    for name, (paper, lo, hi) in bands.items():
        s = runs[name]
        inst, slot = s["bubble_ratio"], s["slot_bubble_ratio"]
        closer = min((inst, "instance idle"), (slot, "batch slots"), key=lambda v: abs(v[0] - paper))
        check(
            f"SortedRL bubble ratio, {name} (8k, group 512)",
            f"{paper:.2%} ({lo:.0%}-{hi:.0%})",
            f"instance idle {inst:.1%}, batch slots {slot:.1%}; judged: {closer[1]}",
            lo <= closer[0] <= hi,
        )
    base = runs["baseline"]["rollout_tokens_per_s"]
    for name, paper, lo, hi in (("on-policy", "+7.6%", -0.05, 0.20), ("partial", "+39.5%", 0.25, 0.55)):
        gain = runs[name]["rollout_tokens_per_s"] / base - 1
        check(
            f"SortedRL rollout throughput over baseline, {name}",
            f"{paper} ({lo:+.0%} to {hi:+.0%})",
            f"{gain:+.1%} (trained tokens per rollout second; length bias {runs[name]['trained_length_bias']:.2f})",
            lo <= gain <= hi,
        )
    big = RLConfig(prompts_per_step=512, samples_per_prompt=8, epochs=1, max_response_len=8192, max_steps=8)
    whole = simulate(tr, "sync", cl, big).summary["rollout_tokens_per_s"]
    check(
        "SortedRL throughput over sync rolling out the whole group per step (512 x 8)",
        "no published figure",
        ", ".join(f"{n} {runs[n]['rollout_tokens_per_s'] / whole - 1:+.0%}" for n in ("on-policy", "partial")),
        None,
    )
    s = runs["on-policy"]
    check("SortedRL on-policy staleness", "0", f"{s['staleness_max']:.0f}", s["staleness_max"] == 0, kind="invariant")
    part = runs["partial"]
    check(
        "SortedRL partial-mode staleness (no knob; bounded by G x n / U = 4)",
        "reported",
        f"max {part['staleness_max']:.0f}, mean {part['staleness_mean']:.2f}",
        0 < part["staleness_max"] <= 4,
        kind="invariant",
    )


def histospec_checks() -> None:
    tr = synthesize(SynthConfig(num_prompts=2048, samples_per_prompt=16, epochs=2, seed=2, max_response_len=20480))
    rl = RLConfig(prompts_per_step=256, samples_per_prompt=16, epochs=2, max_response_len=8192)
    cl = ClusterConfig(num_gpus=32, profile="h100-qwen2.5-14b-tp2")
    base, spec = simulate(tr, "sync", cl, rl), simulate(tr, "sync+histospec", cl, rl)
    gen = [r.steps.groupby("epoch")["timing_s/gen"].sum() for r in (base, spec)]
    e0, e1 = gen[0][0] / gen[1][0], gen[0][1] / gen[1][1]
    check(
        "HistoSpec rollout speedup, 2nd epoch, 8k (lookahead KV, verify knee, drafter CPU, drift)",
        "up to 2.1x (1.5x-2.3x)",
        f"{e1:.2f}x",
        1.5 <= e1 <= 2.3,
    )
    check("HistoSpec on the first epoch", "no drafts, 1.00x", f"{e0:.3f}x", abs(e0 - 1) < 0.005, kind="invariant")


def histopipe_checks() -> None:
    cfg = SynthConfig(preset="reasoning-32k", num_prompts=1024, samples_per_prompt=16, epochs=2, seed=3)
    tr = synthesize(cfg)
    rl = RLConfig(prompts_per_step=128, samples_per_prompt=16, epochs=2, max_response_len=32768)
    cl = ClusterConfig(num_gpus=64)
    runs = {n: simulate(tr, n, cl, rl).summary for n in ("sync", "histopipe", "histopipe(cross_step=true)")}
    t = {n: s["epoch_time_s"][1] for n, s in runs.items()}
    g1, g2 = t["sync"] / t["histopipe"], t["sync"] / t["histopipe(cross_step=true)"]
    check("HistoPipe tier 1 vs per-sample least-loaded sync, 2nd epoch", "no published figure", f"{g1:.2f}x", None)
    check(
        "HistoPipe tier 2 (reconstructed, one step off-policy) vs the same sync",
        "no source; 1.56x is against a disaggregated baseline",
        f"{g2:.2f}x, staleness max {runs['histopipe(cross_step=true)']['staleness_max']:.0f}",
        None,
    )
    dis = ClusterConfig(num_gpus=64, placement="disaggregated", train_gpus=32)
    d = {n: simulate(tr, n, dis, rl).summary for n in ("sync", "one_step_off", "histopipe(one_step_off=true)")}
    td = {n: s["epoch_time_s"][1] for n, s in d.items()}
    rhyme, overlap = td["sync"] / td["histopipe(one_step_off=true)"], td["sync"] / td["one_step_off"]
    check(
        "HistoPipe in the RhymeRL configuration vs disaggregated veRL, 2nd epoch",
        "about 1.43x (1.2x-1.7x)",
        f"{rhyme:.2f}x (one-step overlap alone, no history: {overlap:.2f}x)",
        1.2 <= rhyme <= 1.7,
    )


def _tail_s(result) -> float:  # noqa: ANN001
    """Mean over steps of the time the last 10% of a step's responses take (Seer's tail)."""
    req = result.requests[result.requests.outcome == "finished"]
    start = result.steps.set_index("step")["time/start"]
    tails = []
    for step, g in req.groupby("step"):
        f = np.sort(g.finish_time.to_numpy()) - start[step]
        tails.append(f[-1] - f[int(0.9 * len(f)) - 1])
    return float(np.mean(tails))


def seer_checks() -> None:
    """Seer in its Table 3 setups (docs/policies.md, setups of record; `paper_setups`): per model, throughput over
    veRL's round-robin group-level baseline (and over the per-sample least-loaded one), the
    baseline's rollout seconds, and the tail."""
    for model, gpus, tp, prompts, samples, cap, mean, (paper_verl, paper_seer) in SEER:
        r = seer(model, gpus, tp, prompts, samples, cap, mean)
        gain = r["seer"]["tok_s"] / r["verl"]["tok_s"] - 1
        fair = r["seer"]["tok_s"] / r["least_loaded"]["tok_s"] - 1
        where = f"{model}, {prompts} x {samples}, {cap // 1024}k cap, {gpus} H800s at TP {tp}"
        check(
            f"Seer rollout throughput over veRL (grouped drafting on), {where}",
            f"+{paper_verl / paper_seer - 1:.0%} by its seconds; v3 range +44% to +104% (+55% to +115%)",
            f"{gain:+.0%} (over per-sample least-loaded: {fair:+.0%})",
            0.55 <= gain <= 1.15,
        )
        check(
            f"Seer's veRL baseline rollout seconds, {where}",
            f"{paper_verl:,} s -> Seer {paper_seer:,} s",
            f"{r['verl']['gen_s']:,.0f} s ({r['verl']['gen_s'] / paper_verl - 1:+.0%}) -> {r['seer']['gen_s']:,.0f} s "
            f"({r['seer']['gen_s'] / paper_seer - 1:+.0%})",
            None,
        )
    check("Seer on Kimi-K2 (DP 32 + EP 32 per instance, 256 GPUs)", "12,202 -> 8,267 s",
          "not expressible: an rlsim instance is one TP group", None)  # fmt: skip
    check(
        "Grouped drafting (Seer), mean acceptance length",
        "2.85 (2.5-3.2)",
        "2.81: an input (acceptance 0.75 is calibrated on it), not a result",
        None,
    )


def april_checks() -> None:
    """APRIL in its setup of record (docs/policies.md, setups of record; `paper_setups`), per model; the per-setting
    figures of its Table 1 and README against the one band of record."""
    for model, paper in (("qwen3-4b", "GRPO +31.3%, DAPO +10.8%, README DAPO-Math-17k +17%"),
                         ("qwen3-8b", "GRPO +36.9%, DAPO +9.1%")):  # fmt: skip
        thr = april(model)
        gain = thr["april"] / thr["sync"] - 1
        check(f"APRIL rollout throughput over sync, {model}, 32 x 8, 16k cap, 8 MI300X at TP 2",
              f"{paper} (+10% to +40%)", f"{gain:+.1%}", 0.10 <= gain <= 0.40)  # fmt: skip


def uniform_checks() -> None:
    e, p, s, n = 2, 512, 10, 1500
    idx = np.indices((e, p, s)).reshape(3, -1)
    df = pd.DataFrame(
        {
            "epoch": idx[0].astype("int32"), "prompt_id": idx[1].astype("int64"), "sample_idx": idx[2].astype("int32"),
            "num_prompt_tokens": np.full(e * p * s, 160, dtype="int32"),
            "num_output_tokens": np.full(e * p * s, n, dtype="int32"), "finish_reason": "stop",
        }
    )  # fmt: skip
    tr = Trace(df, TraceMeta("uniform", 4096, s, "synthetic:uniform"))
    rl = RLConfig(prompts_per_step=32, samples_per_prompt=8, epochs=2, max_response_len=4096)
    cl = ClusterConfig(num_gpus=80, profile="h100-qwen2.5-32b-tp2")
    base = simulate(tr, "sync", cl, rl).summary["total_time_s"]
    # SortedRL with a group of P0: its default group of 4 x P0 runs four steps' prompts at once,
    # which in this latency-bound regime gains from the batch, not from the lengths.
    # (colocated: the policies that run only disaggregated are held to one_step_off in tests/test_fully_async.py)
    names = ["sortedrl(group=32)" if n == "sortedrl" else n for n in REGISTRY
             if n != "sync" and not hasattr(REGISTRY[n], "placement")]  # fmt: skip
    ratios = {name: simulate(tr, name, cl, rl).summary["total_time_s"] / base for name in names}
    worst = max(ratios, key=lambda k: abs(ratios[k] - 1))
    check(
        "Uniform lengths: every policy vs sync",
        "within a few % (5%)",
        f"worst {worst} {ratios[worst]:.3f}",
        all(abs(r - 1) <= 0.05 for r in ratios.values()),
    )


def main() -> int:
    t0 = time.perf_counter()
    checks = (
        rollpacker_checks, rollout_share_checks, sortedrl_checks, histospec_checks, histopipe_checks, seer_checks,
        april_checks,
    )  # fmt: skip
    for fn in (*checks, uniform_checks):
        fn()
    counts = count_line()
    if "--markdown" in sys.argv or "--readme" in sys.argv:
        emit("paper_checks", markdown(), sys.argv)  # --readme also writes README.md's table
    else:
        table = Table(title="rlsim against the papers (docs/policies.md)", title_justify="left")
        for c in ("check", "kind", "paper", "rlsim", "result"):
            table.add_column(c)
        colour = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "reported"}
        for name, paper, value, ok, kind in ROWS:
            table.add_row(name, kind, paper, value, colour[ok])
        Console(width=160).print(table)
        print(counts)
    print(f"{counts} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return sum(ok is False for *_, ok, _ in ROWS)


def count_line() -> str:
    """Reproductions and invariants counted apart."""
    out = []
    for kind, verb in (("reproduction", "pass"), ("invariant", "hold")):
        oks = [ok for *_, ok, k in ROWS if k == kind]
        out.append(f"{sum(oks)} of {len(oks)} {kind}s {verb}")
    reported = sum(k == "reported" for *_, k in ROWS)
    return "; ".join(out) + f"; {reported} figures reported without a band"


def markdown() -> str:
    rows = ["| check | kind | paper | rlsim | result |", "|---|---|---|---|---|"]
    rows += [f"| {name} | {kind} | {paper} | {value} | {RESULT[ok]} |" for name, paper, value, ok, kind in ROWS]
    return "\n".join(rows) + f"\n\n{count_line()}."


if __name__ == "__main__":
    sys.exit(main())
