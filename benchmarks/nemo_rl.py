"""Simulating NeMo RL's published runs: the rows, one row's simulation, the fit of the terms.

`benchmarks/published_runs.py` prints the table (every row rlsim can express, simulated from the
row's stated setup, with the error; the rows it cannot express, with the reason);
`tests/test_published_runs.py` checks what it rests on.

The rows and their setups are `benchmarks/published_runs/rows.csv` (built from the three
releases of NeMo RL's performance summary and the recipe behind each row by
`benchmarks/published_runs/extract.py`; see its docstring). Per expressible row:

- the profile: `rlsim profile derive` of the row's model on its GPU (DGX-H100 or GB200) at its
  generation TP and precision, at the recipe's `gpu_memory_utilization`, with vLLM's offline
  defaults on an 80 GB+ GPU (`max_num_seqs` 1024, `max_num_batched_tokens` 16,384: assumed) and
  prefix caching off (NeMo RL's default), trained by Megatron at the row's TP/PP/EP/CP;
- the lengths: the DAPO preset (`dapo-qwen2.5-32b`) rescaled (`length_scale`) so that its mean
  response, capped at the row's maximum sequence length less the prompt, is the row's average
  generated length; every prompt the median prompt length the model's on-policy rows imply
  (tokens/s/GPU x step time x GPUs / samples per step, less the generated length). This is the
  assumption the error carries: the published tables give only the mean and the cap;
- the step: on-policy rows colocated under `sync` (generation and training take turns, the
  engines sleep through training); k-step off-policy rows disaggregated under `k_step_off(k)`
  (`one_step_off` at k = 1), with the recipe's generation GPUs and the rest training. The
  8-step row came in after the terms were fitted: it is predicted apart (`published_async`),
  outside both halves;
- the figure: the mean step time of steps 2-5 (the first has no previous step to overlap), against
  the published mean of 5 steps.

A row's profile holds what `rlsim profile derive` states; `fit` fits the four framework terms
(`rlsim.derive.terms`: per-iteration overhead, per prefilling request, per refit tensor, Megatron's
MFU) on the fit half alone, by the mean squared log error of the step time. `--rows N` runs the
first N expressible rows only (a quick look).
"""

from __future__ import annotations

import functools
import json
import re
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.derive.derive import derive_profile, setup
from rlsim.derive.terms import Terms
from rlsim.derive.train import Trainer
from rlsim.framework_costs import FrameworkSettings
from rlsim.sim.simulate import simulate
from rlsim.trace.synth import synthesize_to_mean as rescaled

ROWS = Path(__file__).resolve().parent / "published_runs" / "rows.csv"
FITTED = Path(__file__).resolve().parents[1] / "rlsim" / "derive" / "terms_nemo-rl.json"
STEPS = 5
PRESET = "dapo-qwen2.5-32b"
PHASES = ("gen", "old_log_prob", "ref", "update_actor", "update_weights")
NEMO_ENGINE = {"max_num_seqs": 1024, "max_num_batched_tokens": 16384, "enable_prefix_caching": False}


def load_rows() -> pd.DataFrame:
    d = pd.read_csv(ROWS)
    on = d[d.policy == "On policy"]
    prompt = on.groupby("model").prompt_tokens.median()
    return d.assign(prompt_len=d.model.map(prompt).fillna(d.prompt_tokens).round().astype(int))


@functools.cache
def _trace(prompts_per_step: int, samples: int, cap: int, prompt_len: int, mean: float):  # noqa: ANN202
    """The DAPO preset rescaled so that its capped mean response is `mean`, every prompt `prompt_len` tokens."""
    n = prompts_per_step * STEPS
    prompts = pd.DataFrame({"prompt_id": np.arange(n), "num_prompt_tokens": np.full(n, prompt_len)})
    return rescaled(PRESET, prompts_per_step, samples, STEPS, cap, mean, prompts)


def policy_of(published: str) -> str:
    """The rlsim policy of a published row's: on-policy `sync`, k-step off-policy `k_step_off(k)`
    (NeMo RL's async GRPO, `max_trajectory_age_steps` k; k = 1 is `one_step_off`)."""
    m = re.match(r"(\d+)-step Off", published)
    if m is None:
        return "sync"
    return "one_step_off" if m.group(1) == "1" else f"k_step_off(k={m.group(1)})"


def simulate_row(row: pd.Series, workdir: Path, terms: Terms = Terms()) -> dict:  # noqa: B008 - frozen
    off = row.policy != "On policy"
    engine = EngineConfig(gpu_memory_utilization=float(row.gpu_memory_utilization), **NEMO_ENGINE)
    layout = {k: int(row[f"train_{k}"]) for k in ("tp", "pp", "ep", "cp")}
    vpp = int(row.train_vpp) if pd.notna(row.train_vpp) and int(layout["pp"]) > 1 else 1
    trainer = Trainer("megatron", **layout, framework=FrameworkSettings(vpp=vpp, recompute=str(row.recompute)))
    gen_pp = int(re.findall(r"\d+", row.gen_tp_pp)[1])  # the table's generation [TP, PP]
    gen = setup(row.rlsim_model, row.gpu, int(row.gen_tp), 1, row.precision, pp=gen_pp)
    raw = terms.apply(derive_profile(gen, engine, trainer))
    path = workdir / f"{raw['name']}-{row.name}.json"
    path.write_text(json.dumps(raw))
    samples = int(row.samples_per_prompt)
    prompts_per_step = int(row.g_gbs) // samples
    cap = int(row.max_seq_len) - int(row.prompt_len)
    trace = _trace(prompts_per_step, samples, cap, int(row.prompt_len), float(row.avg_gen_len))
    train = int(row.gpus) - int(row.gen_gpus) if off else 0
    cluster = ClusterConfig(
        num_gpus=int(row.gpus), profile=str(path), placement="disaggregated" if off else "colocated", train_gpus=train
    )
    rl = RLConfig(prompts_per_step=prompts_per_step, samples_per_prompt=samples, max_response_len=cap, epochs=1,
                  max_steps=STEPS, use_kl_loss=float(row.kl_penalty) > 0)  # fmt: skip
    res = simulate(trace, policy_of(row.policy), cluster, rl, engine_cfg=replace(engine))
    steps = res.steps.iloc[1:]
    phases = {k: float(steps[f"timing_s/{k}"].mean()) for k in PHASES}
    step = float(steps["timing_s/step"].mean())
    return {"simulated_s": step, **phases, "error": step / float(row.step_s) - 1}


def run(rows: pd.DataFrame, terms: Terms, say: bool = False) -> pd.DataFrame:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, row in rows.iterrows():
            r = simulate_row(row, Path(tmp), terms)
            out.append({"i": i, **r})
            if say:
                print(f"{row.release} {row.system:11s} {row.precision} {row.model:11s} {row.policy:10s} {row.gpus:4d} "
                      f"GPUs: published {row.step_s:6.1f} s, rlsim {r['simulated_s']:6.1f} s ({r['error']:+.0%}) "
                      f"[gen {r['gen']:.0f}, logprob {r['old_log_prob']:.0f}, train {r['update_actor']:.0f}, "
                      f"refit {r['update_weights']:.1f}] {row.half}", file=sys.stderr, flush=True)  # fmt: skip
    return pd.DataFrame(out).set_index("i")


def fit(rows: pd.DataFrame) -> tuple[Terms, float]:
    """The terms minimising the mean squared log error of step time over the fit half's rows."""
    fit_rows = rows[(rows.half == "fit") & rows.expressible]

    def terms_of(x: np.ndarray) -> Terms:
        return Terms(layer_iteration_s=float(np.exp(x[0])), sequence_iteration_s=float(np.exp(x[1])),
                     refit_per_tensor_s=float(np.exp(x[2])), megatron_mfu=float(min(1.0, np.exp(x[3]))))  # fmt: skip

    def loss(x: np.ndarray) -> float:
        e = run(fit_rows, terms_of(x)).error
        return float(np.mean(np.log1p(e) ** 2))

    x0 = np.log([2e-4, 1e-5, 5e-4, 0.35])
    best = minimize(loss, x0, method="Nelder-Mead", options={"xatol": 0.02, "fatol": 1e-4, "maxfev": 240})
    return terms_of(best.x), float(best.fun)


def parts(res: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The rows by role: the fit half (both sets), the test half as a whole, and its two sets apart
    (the first split's, and the rows generation across nodes added, which no analysis had seen)."""
    ok = res[res.error.notna()]
    added = ok.added.fillna("").astype(str) != ""
    test = ok[ok.half == "test"]
    return [("fit half", ok[ok.half == "fit"]), ("test half", test),
            ("test half, first split", test[~added[test.index]]),
            ("test half, added (generation across nodes)", test[added[test.index]])]  # fmt: skip
