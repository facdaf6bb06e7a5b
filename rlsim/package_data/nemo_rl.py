"""Simulating NeMo RL's published runs: the rows, one row's simulation, the fit of the terms.

`python -m doctables.published_runs` prints the table (every row rlsim can express, simulated
from its recipe, with the error; the rows it cannot express, with the reason);
`tests/test_published_runs.py` checks what it rests on.

The rows are `published_runs/rows.csv` (built from the three releases of NeMo RL's
performance summary and the recipe behind each row by `published_runs/extract.py`; see
its docstring). Each row's run is set up from its recipe as published, by the reader users run
(`--from nemo-rl:RECIPE.yaml`, `rlsim.frameworks.nemo_rl.read_nemo_rl`), on the recipe and its
`defaults:` chain at the row's commit (`published_runs/nemo_rl/<commit>/`): GPUs and
the generation's share, generation TP/PP, samples and prompts, vLLM's memory fraction and eager
mode, prefix caching off (NeMo RL's default), vLLM's own `LLM`-class limits on the row's GPU
(1,024 sequences, 16,384 batched tokens on H100 and GB200), the KL term, and the Megatron
trainer: TP/PP/EP/CP, virtual stages, recompute, offload and the micro-batches' token budgets of
sequence packing (`train_mb_tokens`, `logprob_mb_tokens`). Where the published table states
another layout than its recipe (`TABLE_NOT_RECIPE`, four rows), the table's is laid over the
recipe's: it is what was measured. Per row:

- the profile: `rlsim profile derive` of the row's model on its GPU at the setup's generation TP
  and the row's precision, trained as the setup states;
- the lengths: the DAPO preset (`dapo-qwen2.5-32b`) rescaled (`length_scale`) so that its mean
  response, capped at the row's maximum sequence length less the prompt, is the row's average
  generated length within 1% (`synthesize_to_mean`, which names its scale and its share of
  responses at the cap); every prompt the median prompt length the model's fit-half on-policy
  rows imply (tokens/s/GPU x step time x GPUs / samples per step, less the generated length), or
  where the fit half has no on-policy row of the model, its fit-half one-step-off rows' (never a
  test row's: `prompt_lengths`). This is the assumption the error carries: the published tables
  give only the mean and the cap;
- the step: the recipe's mode: on-policy rows colocated under `sync` (generation and training
  take turns, the engines sleep through training); k-step off-policy rows (async GRPO,
  `max_trajectory_age_steps` k) disaggregated under `k_step_off(k)` (`one_step_off` at k = 1),
  with the recipe's generation GPUs and the rest training. The 8-step row came in after the
  terms were fitted: it is predicted apart (`published_async`), outside both halves;
- the figure: the mean step time of steps 2-5 (the first has no previous step to overlap), against
  the published mean of 5 steps.

A row's profile holds what `rlsim profile derive` states; `fit` fits framework terms
(`rlsim.derive.terms`: per decoder layer every engine iteration; a second term in one of three
units, per running sequence per decoder layer, per routed token-expert pair per MoE layer or per
network hop of an all-reduce across scale-up domains; per refit tensor; Megatron's MFU on a dense
model, an MoE model at its published efficiency against one) on the fit half alone, by the mean
squared log error of the step time, only those `keep` names. `cross_validate` scores a unit or a
set of terms by two-fold cross-validation inside the fit half, which is how the unit was chosen
(`python -m doctables.published_runs --units`) and how the shipped set is (`--term-sets`, `choose`:
the derived profile, all four and each set of three; the lowest loss ships, a set within 5% of it
ties and the smaller ships).
`--rows N` runs the first N expressible rows only (a quick look).
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from rlsim.config import ClusterConfig, RLConfig
from rlsim.derive.derive import derive_profile
from rlsim.derive.derive import setup as derive_setup
from rlsim.derive.terms import Terms
from rlsim.errors import RlsimError
from rlsim.frameworks.nemo_rl import read_nemo_rl
from rlsim.frameworks.run_setup import RunSetup
from rlsim.package_data import ROOT
from rlsim.sim.simulate import simulate
from rlsim.trace.synth import synthesize_to_mean as rescaled

ROWS = ROOT / "published_runs" / "rows.csv"
RECIPES = ROOT / "published_runs" / "nemo_rl"  # <commit>/<recipe>, with its chain
FITTED = ROOT / "rlsim" / "derive" / "terms_nemo-rl.json"
STEPS = 5
PRESET = "dapo-qwen2.5-32b"
PHASES = ("gen", "old_log_prob", "ref", "update_actor", "update_weights")
# rows whose published table states another layout than the recipe at its commit (rows.csv keeps
# the table's: published_runs/extract.py): (release, recipe file) -> {field: (table, recipe)}
TABLE_NOT_RECIPE = {
    ("0.6", "grpo-deepseek-v3-64n8g.yaml"): {"ep": (16, 32)},
    ("0.6", "grpo-deepseek-v3-64n4g.yaml"): {"ep": (16, 32)},
    ("0.4", "grpo-qwen3-30ba3b-4n8g.yaml"): {"gen_tp": (4, 2), "tp": (2, 1)},
    ("0.4", "grpo-qwen3-30ba3b-4n8g-async-1off.yaml"): {"gen_tp": (4, 2), "tp": (2, 1), "pp": (1, 2)},
}


def prompt_lengths(d: pd.DataFrame) -> pd.Series:
    """Each row's prompt length: the median prompt its model's fit-half on-policy rows imply, or
    where the fit half has none of that model, its fit-half one-step-off rows'. A row's implied
    prompt comes from its published step time, so a test row's never sets one (a model with no
    fit-half row gets none: NaN)."""
    fit = d[d.half == "fit"]
    on = fit[fit.policy == "On policy"].groupby("model").prompt_tokens.median()
    off = fit[fit.policy == "1-step Off"].groupby("model").prompt_tokens.median()
    return d.model.map(on.combine_first(off)).round()

# rows whose published table states a training global batch (T-GBS) other than its recipe's
# `train_global_batch_size` at the row's commit: the recipe's is simulated, since the difference is
# three AdamW steps an update (under 0.1% of these rows' steps); (release, recipe file) -> (table, recipe)
GBS_NOT_RECIPE = {("0.6", f"grpo-qwen3-30ba3b-{n}{off}.yaml"): (512, 2048) for n in ("4n8g", "4n4g")
                  for off in ("", "-async-1off")}  # fmt: skip


def load_rows() -> pd.DataFrame:
    d = pd.read_csv(ROWS)
    prompt = prompt_lengths(d)
    missing = d[prompt.isna() & d.expressible]
    if len(missing):
        raise RlsimError(f"{missing.model.iloc[0]} has no fit-half row to take a prompt length from")
    return d.assign(prompt_len=prompt.fillna(0).astype(int))


@functools.cache
def _trace(prompts_per_step: int, samples: int, cap: int, prompt_len: int, mean: float):  # noqa: ANN202
    """The DAPO preset rescaled so that its capped mean response is `mean`, every prompt `prompt_len` tokens."""
    n = prompts_per_step * STEPS
    prompts = pd.DataFrame({"prompt_id": np.arange(n), "num_prompt_tokens": np.full(n, prompt_len)})
    return rescaled(PRESET, prompts_per_step, samples, STEPS, cap, mean, prompts)


def run_setup(row: pd.Series) -> RunSetup:
    """The row's run as its recipe states it (`read_nemo_rl` on the recipe at the row's commit),
    with the published table's layout where it states another (`TABLE_NOT_RECIPE`)."""
    return _run_setup(str(row.commit), str(row.recipe), str(row.release))


@functools.cache
def _run_setup(commit: str, recipe: str, release: str) -> RunSetup:
    """(Read once per recipe: a recipe's chain of defaults takes most of a second to merge, and the
    tables' scripts set each row up again for every calibration that predicts it.)"""
    s = read_nemo_rl(RECIPES / commit / recipe)
    table = {k: v[0] for k, v in TABLE_NOT_RECIPE.get((release, Path(recipe).name), {}).items()}
    trainer = replace(s.trainer, **{k: table[k] for k in ("tp", "pp", "ep") if k in table})
    if trainer.pp == 1 and trainer.framework.vpp > 1:  # the table's layout has no pipeline to interleave
        trainer = replace(trainer, framework=replace(trainer.framework, vpp=1))
    return replace(s, tp=table.get("gen_tp", s.tp), trainer=trainer)


def simulate_row(row: pd.Series, workdir: Path, terms: Terms = Terms(), setup: RunSetup | None = None,  # noqa: B008
                 mean_scale: float = 1.0) -> dict:  # fmt: skip
    """The row's mean step time and phases over steps 2-5, simulated from its recipe's setup
    (`run_setup`, or `setup` instead), with its error against the published step time and what
    its stand-in is (its share of responses at the cap, its scale); `mean_scale` moves the
    stand-in's target mean (the sensitivity to the one length the table publishes)."""
    s = setup or run_setup(row)
    gen = derive_setup(row.rlsim_model, row.gpu, s.tp, s.ep, s.dtype or "bf16", s.kv_cache_dtype, pp=s.pp)
    engine = s.engine_for(gen.gpu.memory_bytes, gen.gpu.name)
    raw = terms.apply(derive_profile(gen, engine, s.trainer))
    path = workdir / f"{raw['name']}-{row.name}.json"
    path.write_text(json.dumps(raw))
    samples, prompts_per_step = s.samples_per_prompt, s.prompts_per_step
    cap = min(s.max_response_len, int(row.max_seq_len) - int(row.prompt_len))  # vLLM's max_model_len bounds it
    trace = _trace(prompts_per_step, samples, cap, int(row.prompt_len), float(row.avg_gen_len) * mean_scale)
    cluster = ClusterConfig(num_gpus=s.num_gpus, profile=str(path), placement=s.placement, train_gpus=s.train_gpus)
    rl = RLConfig(prompts_per_step=prompts_per_step, samples_per_prompt=samples, max_response_len=cap, epochs=1,
                  max_steps=STEPS, use_kl_loss=s.use_kl_loss)  # fmt: skip
    res = simulate(trace, s.policy, cluster, rl, engine_cfg=engine)
    steps = res.steps.iloc[1:]
    phases = {k: float(steps[f"timing_s/{k}"].mean()) for k in PHASES}
    step = float(steps["timing_s/step"].mean())
    stand_in = trace.meta.source_params["stand_in"]
    return {"simulated_s": step, **phases, "error": step / float(row.step_s) - 1, "at_cap": stand_in["clip_share"],
            "length_scale": stand_in["length_scale"], "stand_in_mean": stand_in["mean"], "cap": cap,
            "backend": "fsdp" if s.trainer.backend.startswith("fsdp") else s.trainer.backend}  # fmt: skip


def run(rows: pd.DataFrame, terms: Terms, say: bool = False, mean_scale: float = 1.0) -> pd.DataFrame:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, row in rows.iterrows():
            r = simulate_row(row, Path(tmp), terms, mean_scale=mean_scale)
            out.append({"i": i, **r})
            if say:
                print(f"{row.release} {row.system:11s} {row.precision} {row.model:11s} {row.policy:10s} {row.gpus:4d} "
                      f"GPUs: published {row.step_s:6.1f} s, rlsim {r['simulated_s']:6.1f} s ({r['error']:+.0%}) "
                      f"[gen {r['gen']:.0f}, logprob {r['old_log_prob']:.0f}, train {r['update_actor']:.0f}, "
                      f"refit {r['update_weights']:.1f}] {row.half}", file=sys.stderr, flush=True)  # fmt: skip
    return pd.DataFrame(out).set_index("i")


# the second term's candidate units: its field and its start (10 us a sequence, or a token, over 60 layers, x 8
# experts; 20 us a network hop, four times NCCL's wire latency)
UNITS = {"sequence": ("sequence_layer_iteration_s", 1e-5 / 60), "expert": ("expert_token_layer_s", 1e-5 / 60 / 8),
         "hop": ("net_hop_s", 2e-5)}  # fmt: skip
# the second term's unit, as `--term-sets` cross-validates it (it did not ship with the stand-ins at
# their means: docs/accuracy.md); chosen by the lower two-fold cross-validated loss inside the fit half (`--units
# expert,hop,sequence`, with the update's AdamW step costed: 0.0529 per token-expert pair, 0.0532 per
# network hop of an all-reduce across scale-up domains, 0.0594 per sequence per layer; with 5 s assumed
# per update: 0.0546, 0.0555 and 0.0642; before an MoE model's Megatron training was charged at its
# published efficiency: 0.0533 per pair against 0.0832 per sequence)
SHIPPED_UNIT = "expert"


def fit_half(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows the terms may be fitted on."""
    return rows[(rows.half == "fit") & rows.expressible]


# the four terms, by the names `--terms-sets` and the cross-validation table use: (field, start)
TERM_NAMES = ("layer", "second", "refit", "mfu")
STARTS = {"layer": ("layer_iteration_s", 2e-4), "refit": ("refit_per_tensor_s", 5e-4),
          "mfu": ("megatron_dense_mfu", 0.35)}  # fmt: skip
# the sets cross-validated before a refit: none (the derived profile), all four, and each with one dropped
TERM_SETS = {"derived": (), "all four": TERM_NAMES,
             **{f"without {t}": tuple(n for n in TERM_NAMES if n != t) for t in TERM_NAMES}}  # fmt: skip
TIE = 0.05  # a set within 5% of the lowest cross-validated loss ties with it; the smaller set ships


def _errors(args: tuple) -> pd.Series:
    rows, terms = args
    return run(rows, terms).error


def fit(rows: pd.DataFrame, unit: str = SHIPPED_UNIT, keep: tuple[str, ...] = TERM_NAMES,
        pool=None) -> tuple[Terms, float]:  # noqa: ANN001 - a process pool, or None
    """The terms minimising the mean squared log error of step time over the fit half's rows, with
    the second term in `unit` (`UNITS`); only the terms in `keep` are fitted, the others keep their
    derived values (`keep` empty: the derived profile, its loss). `pool`: a process pool whose
    workers simulate the rows in two parts (the same errors, in half the time on two cores)."""
    fit_rows = fit_half(rows)
    start = {**STARTS, "second": UNITS[unit]}
    halves = [fit_rows.iloc[::2], fit_rows.iloc[1::2]]

    def terms_of(x: np.ndarray) -> Terms:
        values = {start[k][0]: float(np.exp(v)) for k, v in zip(keep, x, strict=True)}
        if "megatron_dense_mfu" in values:
            values["megatron_dense_mfu"] = min(1.0, values["megatron_dense_mfu"])
        return Terms(**values)

    def loss(x: np.ndarray) -> float:
        if pool is None:
            e = run(fit_rows, terms_of(x)).error
        else:
            e = pd.concat(pool.map(_errors, [(h, terms_of(x)) for h in halves]))
        return float(np.mean(np.log1p(e) ** 2))

    if not keep:
        return Terms(), loss(np.array([]))
    x0 = np.log([start[k][1] for k in keep])
    best = minimize(loss, x0, method="Nelder-Mead", options={"xatol": 0.02, "fatol": 1e-4, "maxfev": 240})
    return terms_of(best.x), float(best.fun)


def folds(rows: pd.DataFrame) -> pd.Series:
    """The fit half's rows in two folds, its configurations alternating within each model (as the
    halves were split), so that every configuration's rows stay in one fold."""
    ok = fit_half(rows)
    fold = {c: i % 2 for _, part in ok.groupby("model") for i, c in enumerate(sorted(set(part.config)))}
    return ok.config.map(fold)


def _fold_errors(args: tuple) -> pd.Series:
    rows, unit, keep, k = args
    fold = folds(rows)
    terms, _ = fit(rows.loc[fold.index[fold != k]], unit, keep)
    return run(rows.loc[fold.index[fold == k]], terms).error


def cross_validate(rows: pd.DataFrame, unit: str, keep: tuple[str, ...] = TERM_NAMES, pool=None) -> float:  # noqa: ANN001
    """Two-fold cross-validation inside the fit half: the terms in `keep` fitted on one fold, the
    other fold's mean squared log error, over both folds' rows. It chooses a unit and which terms
    ship from the fit half alone (the validation half is never read). `pool`: a process pool's `map`."""
    jobs = [(rows, unit, keep, k) for k in (0, 1)]
    errors = list((pool or map)(_fold_errors, jobs))
    return float(np.mean(np.log1p(pd.concat(errors)) ** 2))


def choose(losses: dict[str, float]) -> str:
    """The term set that ships: the lowest cross-validated loss; a set within `TIE` of it ties,
    and of tied sets the smaller ships (then the lower loss)."""
    low = min(losses.values())
    tied = [name for name, loss in losses.items() if loss <= low * (1 + TIE)]
    return min(tied, key=lambda name: (len(TERM_SETS[name]), losses[name]))


def parts(res: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The rows by role: the fit half (both sets), the validation half as a whole (`rows.csv` calls
    it `test`: it was held back from every fit, but model changes were made after its errors were
    printed, docs/accuracy.md), and its two sets apart (the first split's, and the rows generation
    across nodes added)."""
    ok = res[res.error.notna()]
    added = ok.added.fillna("").astype(str) != ""
    test = ok[ok.half == "test"]
    return [("fit half", ok[ok.half == "fit"]), ("validation half", test),
            ("validation half, first split", test[~added[test.index]]),
            ("validation half, added (generation across nodes)", test[added[test.index]])]  # fmt: skip


def release_spreads() -> pd.DataFrame:
    """How far apart NeMo RL publishes one configuration across releases with its recipe unchanged
    (`python -m doctables.release_spread`): one row per configuration published in two or more
    releases, with its releases, whether its recipe is identical across them (and why not), its
    published steps and its spread."""
    d = pd.read_csv(ROWS)
    out = []
    for config, part in d.groupby("config"):
        if part.release.nunique() < 2:
            continue
        texts = {(Path(RECIPES) / str(r.commit) / str(r.recipe)).read_bytes() for _, r in part.iterrows()}
        overlay = any((str(r.release), Path(r.recipe).name) in TABLE_NOT_RECIPE for _, r in part.iterrows())
        why = "table's layout over the recipe" if overlay else ("" if len(texts) == 1 else "recipe changed")
        steps = part.sort_values("release").step_s
        out.append({"config": config, "model": part.model.iloc[0], "half": part.half.iloc[0],
                    "releases": ", ".join(part.sort_values("release").release.astype(str)),
                    "steps": " / ".join(f"{s:.1f}" for s in steps), "identical": not why, "why_not": why,
                    "spread": float(steps.max() / steps.min() - 1)})  # fmt: skip
    return pd.DataFrame(out)
