"""Paper checks in their setups of record (docs/policies.md, setups of record): RollPacker, APRIL and Seer.

Used by `doctables/paper_checks.py`. Every setup's profile is `rlsim profile derive` of the
paper's model on its GPU at its rollout TP, trained by Megatron at the paper's layout where it is
published, with the framework terms fitted on NeMo RL's published runs (`--terms nemo-rl`) laid
over it: no constant here is fitted to these papers' figures, so every seconds figure is a test
of whether those terms transfer to another framework.

- **RollPacker** (NSDI'26, github.com/Farrrrland/RollPacker): Qwen2.5-7B / 14B / 32B at 8k / 16k /
  32k on 16 / 32 / 64 H800s, rollout TP 1 / 2 / 2, training TP,PP,CP 2,1,1 / 2,2,2 / 4,1,4;
  P0 = 128, R0 = 8; vLLM at `gpu_memory_utilization` 0.85 and `max_num_seqs` 2048 as the artifact's
  Figure 11 config sets them. Figure 11's bars are RollPacker's own stack at eta = 1.0 (the baseline) and
  with one factor varied (fixed P: eta_r = 1.125 / 1.25 / 1.5; fixed R: eta_p likewise); its
  timer is the maximum over the short rounds, which rlsim takes too. The timer also holds the
  inference server's start and the reward workers' loading, which rlsim does not model (its
  seconds are generation alone), and the paper's workload mixes math, code and QA where rlsim
  runs the DAPO preset (`paper_checks.rollpacker_trace`).
- **APRIL** (arXiv 2509.18521): Qwen3-4B and Qwen3-8B on one node of 8 MI300X, colocated, 2 GPUs
  per engine, Megatron TP 2; 32 prompts x 8, 16,384-token cap, 2x over-provisioning
  (`async_partial(over_sample_rate=2.0)`) against the same run without partial rollout (`sync`),
  on the bundled DAPO-Math-17k trace capped at 16k. APRIL runs SGLang; these checks schedule as
  vLLM does, and `doctables/sglang_setups.py` re-runs APRIL and Seer under SGLang's rules.
- **Seer** (arXiv 2511.14617 v3, Table 3): Moonlight-16B-A3B on 32 H800s (one per instance),
  400 x 8, cap 65,536, mean 22,386; Qwen2-VL-72B (its language model) on 128 H800s at TP 8, 600 x 16,
  cap 40,960, mean 7,615; 5 iterations. The `reasoning-32k` preset rescaled to each mean and cap
  (an assumption: the paper gives only those two). Baseline veRL, colocated, round-robin
  group-level (`dispatch="per_prompt"`); the per-sample least-loaded baseline is reported beside
  it. Kimi-K2 (DP 32 + EP 32 per instance) is not expressible: an rlsim instance is one TP group.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import numpy as np

from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.derive.derive import derive_profile, setup
from rlsim.derive.terms import load_terms
from rlsim.derive.train import Trainer
from rlsim.package_data.nemo_rl import rescaled
from rlsim.paths import default_trace
from rlsim.sim.simulate import simulate
from rlsim.trace.format import load

WORKDIR = Path(tempfile.mkdtemp(prefix="rlsim-paper-setups-"))


@functools.cache
def record_profile(
    model: str, gpu: str, tp: int, train: tuple[int, int, int] = (1, 1, 1), engine: EngineConfig | None = None,
    fitted: bool = True,
) -> str:
    """Path of the derived profile of a setup of record (training TP, PP, CP; the engine where the
    paper's artifact states it, else veRL's defaults), the fitted NeMo RL terms laid over it
    unless `fitted` is False."""
    train_tp, train_pp, train_cp = train
    raw = derive_profile(setup(model, gpu, tp), engine, Trainer("megatron", tp=train_tp, pp=train_pp, cp=train_cp))
    if fitted:
        terms, where = load_terms("nemo-rl")
        raw = terms.apply(raw, where)
    tag = f"t{train_tp}p{train_pp}c{train_cp}-{abs(hash(engine))}-{'fitted' if fitted else 'derived'}"
    path = WORKDIR / f"{raw['name']}-{tag}.json"
    path.write_text(json.dumps(raw))
    return str(path)


def short_round_max_s(result, p0: int, r0: int, eta_p: float) -> float:  # noqa: ANN001
    """Figure 11's timer: the longest short round's generation time (every round is short at eta_p = 1)."""
    launched = result.requests.groupby("step").size()
    gen = result.steps.set_index("step")["timing_s/gen"]
    short = [s for s, n in launched.items() if eta_p == 1.0 or n != p0 * r0]
    return float(gen.loc[short].max())


# cap, model, GPUs, rollout TP, training (TP, PP, CP), Figure 11 bars at eta 1.0 / 1.125 / 1.25 / 1.5
# with P fixed (eta_r varies) and with R fixed (eta_p varies), seconds
ROLLPACKER = (
    (8192, "qwen2.5-7b", 16, 1, (2, 1, 1), (82, 77, 71, 54), (82, 77, 72, 60)),
    (16384, "qwen2.5-14b", 32, 2, (2, 2, 2), (277, 260, 232, 115), (277, 244, 169, 143)),
    (32768, "qwen2.5-32b", 64, 2, (4, 1, 4), (673, 658, 655, 265), (673, 636, 259, 279)),
)
ETAS = (1.0, 1.125, 1.25, 1.5)
# The artifact's vLLM settings for Figure 11 (examples/sensitive_analysis_fig11/rlvr_config_qwen2_5_7B.yaml)
ROLLPACKER_ENGINE = EngineConfig(gpu_memory_utilization=0.85, max_num_seqs=2048)


def rollpacker_figure11(trace, periods: int) -> list[dict]:  # noqa: ANN001
    """Per cap: Figure 11's bars simulated (max over short rounds), sync's mean rollout and total.
    RollPacker runs on ROLL, for which no published run supports framework terms: ROLL's setting is
    the derived profile (no term fitted), stated before the run; NeMo RL's terms give the baseline
    bar beside it, for comparison only."""
    out = []
    for cap, model, gpus, tp, train, fixed_p, fixed_r in ROLLPACKER:
        prof = record_profile(model, "h800", tp, train, ROLLPACKER_ENGINE, fitted=False)
        rl = RLConfig(prompts_per_step=128, samples_per_prompt=8, epochs=1, max_response_len=cap, max_steps=5 * periods)
        cl = ClusterConfig(num_gpus=gpus, profile=prof)
        runs = {(ep, er): simulate(trace, f"rollpacker(eta_p={ep},eta_r={er})", cl, rl)
                for ep, er in {(1.0, e) for e in ETAS} | {(e, 1.0) for e in ETAS} | {(1.25, 1.25)}}  # fmt: skip
        bars = {k: short_round_max_s(r, 128, 8, k[0]) for k, r in runs.items()}
        sync = simulate(trace, "sync", cl, rl)
        nemo = ClusterConfig(num_gpus=gpus, profile=record_profile(model, "h800", tp, train, ROLLPACKER_ENGINE))
        base_nemo = short_round_max_s(simulate(trace, "rollpacker(eta_p=1.0,eta_r=1.0)", nemo, rl), 128, 8, 1.0)
        out.append({
            "cap": cap, "model": model, "gpus": gpus, "tp": tp, "bars": bars, "paper_p": fixed_p, "paper_r": fixed_r,
            "both": runs[(1.25, 1.25)], "base": runs[(1.0, 1.0)], "sync": sync, "base_nemo": base_nemo,
        })  # fmt: skip
    return out


def april(model: str, steps: int = 12, rollout_engine: str = "vllm") -> dict[str, float]:
    """Rollout throughput (trained tokens per rollout second) of sync and 2x-over-provisioned partial
    rollout, under vLLM's scheduling rules or SGLang's (APRIL's engine)."""
    tr = load(default_trace(), columns=[])
    prof = record_profile(model, "mi300x", 2, (2, 1, 1))
    rl = RLConfig(prompts_per_step=32, samples_per_prompt=8, epochs=1, max_response_len=16384, max_steps=steps)
    cl = ClusterConfig(num_gpus=8, profile=prof)
    eng = EngineConfig(rollout_engine=rollout_engine)
    return {n: simulate(tr, p, cl, rl, engine_cfg=eng).summary["rollout_tokens_per_s"]
            for n, p in (("sync", "sync"), ("april", "async_partial(over_sample_rate=2.0)"))}  # fmt: skip


# model, GPUs, rollout TP, prompts, samples, cap, mean, paper's veRL -> Seer seconds
SEER = (
    ("moonlight-16b-a3b", 32, 1, 400, 8, 65536, 22386, (3910, 2181)),
    ("qwen2-vl-72b", 128, 8, 600, 16, 40960, 7615, (3957, 1922)),
)


def seer(model: str, gpus: int, tp: int, prompts: int, samples: int, cap: int, mean: float, steps: int = 5,
         rollout_engine: str = "vllm") -> dict:  # fmt: skip
    """Seer (grouped drafting on; under SGLang's rules, which rlsim models without speculation,
    its scheduling alone) and veRL's baseline in Seer's Table 3 setup: throughput and rollout seconds."""
    tr = rescaled("reasoning-32k", prompts, samples, steps, cap, mean, bracket=(0.05, 8.0, 25))
    prof = record_profile(model, "h800", tp)
    rl = RLConfig(prompts_per_step=prompts, samples_per_prompt=samples, epochs=1, max_response_len=cap, max_steps=steps)
    eng = EngineConfig(rollout_engine=rollout_engine)
    seer_policy = "seer+grouped_spec" if rollout_engine == "vllm" else "seer"
    out = {}
    for name, policy, dispatch in (("verl", "sync", "per_prompt"), ("least_loaded", "sync", "least_loaded"),
                                   ("seer", seer_policy, "least_loaded")):  # fmt: skip
        res = simulate(tr, policy, ClusterConfig(num_gpus=gpus, profile=prof, dispatch=dispatch), rl, engine_cfg=eng)
        out[name] = {"tok_s": res.summary["rollout_tokens_per_s"], "gen_s": float(res.steps["timing_s/gen"].mean())}
    out["mean_len"] = float(tr.table["num_output_tokens"].clip(upper=cap).mean())
    return out


def describe_bars(row: dict) -> tuple[str, str]:
    """Figure 11's bars, paper against rlsim, as two strings."""
    paper = [f"P: {'/'.join(map(str, row['paper_p']))}", f"R: {'/'.join(map(str, row['paper_r']))}"]
    ours = [
        "P: " + "/".join(f"{row['bars'][(1.0, e)]:.0f}" for e in ETAS),
        "R: " + "/".join(f"{row['bars'][(e, 1.0)]:.0f}" for e in ETAS),
    ]
    err = [row["bars"][(1.0, e)] / p - 1 for e, p in zip(ETAS, row["paper_p"], strict=True)]
    err += [row["bars"][(e, 1.0)] / p - 1 for e, p in zip(ETAS, row["paper_r"], strict=True)]
    return "; ".join(paper) + " s", "; ".join(ours) + f" s (median |error| {np.median(np.abs(err)):.0%})"
