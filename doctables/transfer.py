"""Transfer accuracy: calibrate on one published run, predict the others of its family.

    python -m doctables.transfer [--markdown | --readme]   # --readme also writes published_runs/transfer.json

What a user does with their last run: `rlsim calibrate run` on it (`rlsim.calibration.run`), then
predict the runs they are deciding between. Every calibration starts from the derived profile
(`rlsim profile derive` on the H20 with the scripts' settings, as `verl_phases.py` sets each run
up), never from terms fitted on published runs; each family is left one out: every run whose
phases are published is the calibration run in turn, and every other run of its family is
predicted (a run's own mode against the other mode at its own GPU count counts too).

Families (veRL's `recipe/fully_async_policy` README, tag v0.7.0; H20 GPUs):
- Qwen2.5-Math-7B, DAPO, 512 prompts x 16, 28K responses: the colocated synchronous runs at 32,
  64 and 128 GPUs (step, gen, old_log_prob, update_actor published) and `fully_async` at the same
  counts split half and half (its time per 512 prompts), as `verl_fully_async.py` sets it up;
- Qwen3-30B-A3B-Base, GRPO, 8K responses: the colocated synchronous run at 128 GPUs (with its
  reference pass) and `fully_async` at 96 rollout : 32 trainer GPUs, as its launch script sets it
  (`published_runs/verl/grpo_30b_a3b_base_math_megatron_96_32.overrides`). With one run of each
  mode, only the synchronous run is a calibration run.
- apart from the targets (`transfer_nemo_rl`): NeMo RL's published rows of one model, GPU and release
  (`published_runs.py`'s rows, each set up as `nemo_rl.simulate_row` sets it up), step time only,
  so each calibration keeps at most one term (the one its step identifies).

The published figures are per-phase means, not per-step logs: the script writes each as a
metrics file of `STEPS` equal steps (veRL's names) and says so; a phase the README does not give
(the weight update) is not in it, so its term is refused and keeps its derived value. The runs
publish no lengths: both the calibration and the predictions run on the stand-in (the DAPO preset
at the run's cap), and every figure is given at the stand-in's lengths and at 25% shorter and
longer (`length_scale` 0.75 and 1.25), the same in calibration and prediction.

Targets (the calibration issue's): predicted steps, median at most 10% and worst at most 20%;
every async-against-sync ratio within 10% of the published one, none on the wrong side of 1.

`tests/test_readme_tables.py` re-runs it at the stand-in's lengths alone (`build(scales=(1.0,))`,
a third of the calibrations) and the NeMo RL rows whole, and whole: both among the checks too long
for CI (`.ci/long`).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from doctables.verl_fully_async import POLICY as DENSE_POLICY
from doctables.verl_fully_async import PUBLISHED as DENSE_ASYNC
from doctables.verl_phases import DENSE_ENGINE, DENSE_TRAINER, MOE_SETUP, PRESET, RUNS, _engine
from rlsim.calibration.run import LoggedRun, calibrate
from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.derive.derive import derive_profile, setup
from rlsim.derive.terms import Terms
from rlsim.package_data.markers import emit
from rlsim.profile import profile_from_dict
from rlsim.sim.simulate import simulate
from rlsim.trace.synth import SynthConfig, synthesize

STEPS = 9  # the metrics file's steps: the first, then 8 (every 4th of them held out)
ASYNC_UPDATES = 32
SCALES = (1.0, 0.75, 1.25)
OUT = Path(__file__).resolve().parents[1] / "published_runs" / "transfer.json"
MOE_ASYNC_STEP = 282.75  # README, "30B Model Mode Experiment": Fully Async Policy 96:32, Step (s)


@dataclass(frozen=True)
class Member:
    """A run of a family: the setup rlsim simulates and what was published."""

    family: str
    label: str
    model: str
    gpus: int
    train_gpus: int  # 0: colocated synchronous
    policy: str
    cap: int
    engine: EngineConfig
    trainer: object
    use_kl_loss: bool
    step: float  # published seconds per 512 prompts
    phases: dict  # published phase means (synchronous runs), else {}


def members() -> list[Member]:
    out = []
    for run in RUNS:
        dense = run.model == "qwen2.5-7b"
        family = "Qwen2.5-Math-7B" if dense else "Qwen3-30B-A3B"
        phases = {k: v for k, v in run.published.items() if k != "step"}
        out.append(Member(family, f"sync, {run.gpus} GPUs", run.model, run.gpus, 0, "sync", run.cap, run.engine,
                          run.trainer, run.use_kl_loss, run.published["step"], phases))  # fmt: skip
        if dense:
            pub = DENSE_ASYNC[run.gpus]
            out.append(Member(family, f"fully_async, {run.gpus // 2}:{run.gpus // 2}", run.model, run.gpus,
                              run.gpus // 2, DENSE_POLICY, run.cap, DENSE_ENGINE, DENSE_TRAINER, run.use_kl_loss,
                              pub["async_step"], {}))  # fmt: skip
        else:
            out.append(Member(family, "fully_async, 96:32", run.model, MOE_SETUP.num_gpus, MOE_SETUP.train_gpus,
                              MOE_SETUP.policy, run.cap, _engine(MOE_SETUP), MOE_SETUP.trainer, MOE_SETUP.use_kl_loss,
                              MOE_ASYNC_STEP, {}))  # fmt: skip
    return out


def _raw(m: Member) -> dict:
    return derive_profile(setup(m.model, "h20", 4), m.engine, m.trainer)


def _trace(m: Member, scale: float, prompts: int):  # noqa: ANN202
    return synthesize(SynthConfig(preset=PRESET, num_prompts=prompts, samples_per_prompt=16, epochs=1,
                                  prompts_per_step=512, max_response_len=m.cap, length_scale=scale))  # fmt: skip


def metrics_file(m: Member) -> pd.DataFrame:
    """The published phase means as a veRL metrics file of `STEPS` equal steps (what the README gives)."""
    row = {f"timing_s/{k}": v for k, v in m.phases.items()} | {"timing_s/step": m.step}
    return pd.DataFrame([{"step": s, **row} for s in range(1, STEPS + 1)])


def calibrated(m: Member, scale: float):  # noqa: ANN201 - rlsim.calibration.run.Calibration
    raw = _raw(m)
    rl = RLConfig(prompts_per_step=512, samples_per_prompt=16, max_response_len=m.cap, epochs=1, max_steps=STEPS,
                  use_kl_loss=m.use_kl_loss)  # fmt: skip
    run = LoggedRun(m.label, _trace(m, scale, 512 * STEPS), "sync", ClusterConfig(num_gpus=m.gpus, profile=raw["name"]),
                    rl, m.engine, raw, metrics_file(m), f"the stand-in at length_scale {scale}")  # fmt: skip
    return calibrate([run], bootstrap=200)


def predict(m: Member, terms: dict, scale: float) -> float:
    """Seconds per 512 prompts of `m` simulated at `terms` over its derived profile (the synchronous
    step's mean after the first; fully_async's time per four updates after the first sync)."""
    prof = profile_from_dict(Terms(**terms).apply(_raw(m)), "calibrated")
    if m.policy == "sync":
        rl = RLConfig(prompts_per_step=512, samples_per_prompt=16, max_response_len=m.cap, epochs=1, max_steps=STEPS,
                      use_kl_loss=m.use_kl_loss)  # fmt: skip
        res = simulate(_trace(m, scale, 512 * STEPS), "sync", ClusterConfig(num_gpus=m.gpus, profile=prof.name), rl,
                       profile=prof, engine_cfg=m.engine)  # fmt: skip
        return float(res.steps["timing_s/step"].iloc[1:].mean())
    rl = RLConfig(prompts_per_step=512, samples_per_prompt=16, max_response_len=m.cap, epochs=1,
                  max_steps=ASYNC_UPDATES, use_kl_loss=m.use_kl_loss)  # fmt: skip
    cluster = ClusterConfig(num_gpus=m.gpus, profile=prof.name, placement="disaggregated", train_gpus=m.train_gpus)
    res = simulate(_trace(m, scale, 512 * 12), m.policy, cluster, rl, profile=prof, engine_cfg=m.engine)
    ends = res.steps["time/end"].to_numpy()
    return float((ends[-1] - ends[3]) / ((len(ends) - 4) / 4))


def build(scales: tuple[float, ...] = SCALES) -> dict:
    """Every calibration run, every prediction of its family, every ratio, and the summary, at
    these length scales (the stand-in's, 1.0, first)."""
    ms = members()
    preds, ratios, cals = [], [], []
    for scale in scales:
        for src in (m for m in ms if m.phases):
            cal = calibrated(src, scale)
            cals.append({"family": src.family, "run": src.label, "scale": scale, "terms": cal.terms,
                         "refused": sorted(cal.refused)})  # fmt: skip
            got = {m.label: predict(m, cal.terms, scale) for m in ms if m.family == src.family}
            for m in ms:
                if m.family != src.family or m is src:
                    continue
                preds.append({"family": src.family, "calibrated_on": src.label, "scale": scale, "run": m.label,
                              "published": m.step, "rlsim": got[m.label],
                              "error_pct": 100 * (got[m.label] / m.step - 1)})  # fmt: skip
            for m in ms:
                if m.family != src.family or m.policy != "sync":
                    continue
                twin = next(a for a in ms if a.family == m.family and a.policy != "sync" and a.gpus == m.gpus)
                pub, sim = m.step / twin.step, got[m.label] / got[twin.label]
                ratios.append({"family": src.family, "calibrated_on": src.label, "scale": scale, "gpus": m.gpus,
                               "published": pub, "rlsim": sim, "error_pct": 100 * (sim / pub - 1),
                               "wrong_side": (pub > 1) != (sim > 1)})  # fmt: skip
    return {"calibrations": cals, "predictions": preds, "ratios": ratios, "summary": summary(preds, ratios)}


def _stats(errs: list[float]) -> dict:
    a = [abs(e) for e in errs]
    return {"predictions": len(a), "median_abs_pct": round(statistics.median(a), 1), "worst_abs_pct": round(max(a), 1)}


def summary(preds: list[dict], ratios: list[dict]) -> dict:
    """At the stand-in's lengths (the band a calibrated prediction prints) and at +/-25%."""
    out = {}
    for scale in dict.fromkeys(r["scale"] for r in preds):
        p = [r["error_pct"] for r in preds if r["scale"] == scale]
        q = [r for r in ratios if r["scale"] == scale]
        out[str(scale)] = {"steps": _stats(p), "ratios": _stats([r["error_pct"] for r in q]) | {
            "wrong_side": sum(r["wrong_side"] for r in q)}}  # fmt: skip
    return out


def _rows(records: list[dict], key: tuple[str, ...], row: Callable, lengths: Callable | None) -> list[str]:
    """Each record's row at the stand-in's lengths (`row`), and where the other lengths were built,
    its cell at 25% shorter and longer (`lengths(shorter, longer)`; a record missing there is an error)."""
    by = {(*(r[k] for k in key), r["scale"]): r for r in records}
    out = []
    for r in (r for r in records if r["scale"] == 1.0):
        at = tuple(r[k] for k in key)
        out.append(row(r) + (lengths(by[(*at, 0.75)], by[(*at, 1.25)]) if lengths else ""))
    return out


def tables(data: dict) -> dict[str, str]:
    """The tables; built at the stand-in's lengths alone, without their last column (the errors at
    lengths 25% shorter and longer) and with the summary's first row alone."""
    whole = len(data["summary"]) > 1
    last = (" at lengths -25% / +25% |", "---|") if whole else ("", "")
    steps = ["| family | calibrated on | predicted | published (s) | rlsim, stand-in (s) | error |" + last[0],
             "|---|---|---|---:|---:|---:|" + last[1]]  # fmt: skip
    steps += _rows(data["predictions"], ("calibrated_on", "run"),
                   lambda r: (f"| {r['family']} | {r['calibrated_on']} | {r['run']} | {r['published']:.0f} | "
                              f"{r['rlsim']:.0f} | {r['error_pct']:+.0f}% |"),
                   (lambda lo, hi: f" {lo['error_pct']:+.0f}% / {hi['error_pct']:+.0f}% |") if whole
                   else None)  # fmt: skip
    rat = ["| family | calibrated on | GPUs | published sync / fully_async | rlsim, stand-in | error |" + last[0],
           "|---|---|---:|---:|---:|---:|" + last[1]]  # fmt: skip
    rat += _rows(data["ratios"], ("calibrated_on", "gpus"),
                 lambda r: (f"| {r['family']} | {r['calibrated_on']} | {r['gpus']} | {r['published']:.2f}x | "
                            f"{r['rlsim']:.2f}x{' (wrong side of 1)' if r['wrong_side'] else ''} | "
                            f"{r['error_pct']:+.0f}% |"),
                 (lambda lo, hi: f" {lo['rlsim']:.2f}x / {hi['rlsim']:.2f}x |") if whole else None)  # fmt: skip
    summ = ["| lengths | steps: median / worst abs error (target 10% / 20%) | ratios: median / worst (target: all "
            "within 10%) | ratios on the wrong side of 1 |", "|---|---|---|---:|"]  # fmt: skip
    for scale, s in data["summary"].items():
        st, ra = s["steps"], s["ratios"]
        name = {"1.0": "stand-in", "0.75": "25% shorter", "1.25": "25% longer"}[scale]
        summ.append(f"| {name} | {st['median_abs_pct']:.0f}% / {st['worst_abs_pct']:.0f}% ({st['predictions']}) | "
                    f"{ra['median_abs_pct']:.0f}% / {ra['worst_abs_pct']:.0f}% ({ra['predictions']}) | "
                    f"{ra['wrong_side']} |")  # fmt: skip
    return {"transfer": "\n".join(steps) + "\n", "transfer_ratios": "\n".join(rat) + "\n",
            "transfer_summary": "\n".join(summ) + "\n"}  # fmt: skip


def transfer_json(data: dict) -> str:
    """The figures `rlsim/bands.json` carries as `transfer` (the band a calibrated prediction prints)."""
    s = data["summary"]["1.0"]
    return json.dumps({"about": "Calibrate on one published run, predict the others of its family "
                       "(doctables/transfer.py), at the stand-in's lengths.", "steps": s["steps"],
                       "ratios": s["ratios"]}, indent=1) + "\n"  # fmt: skip


NEMO_STEPS = 9


def _nemo_rl_calibration(row: pd.Series):  # noqa: ANN202 - rlsim.calibration.run.Calibration
    """One NeMo RL row as a step-only log (its published step time written as `NEMO_STEPS` equal
    steps), its run set up as `nemo_rl.simulate_row` sets it up, calibrated from the derived profile."""
    import numpy as np

    from rlsim.derive.derive import setup as derive_setup
    from rlsim.package_data.nemo_rl import PRESET as NEMO_PRESET
    from rlsim.package_data.nemo_rl import run_setup
    from rlsim.trace.synth import synthesize_to_mean

    s = run_setup(row)
    gen = derive_setup(row.rlsim_model, row.gpu, s.tp, s.ep, s.dtype or "bf16", s.kv_cache_dtype, pp=s.pp)
    engine = s.engine_for(gen.gpu.memory_bytes, gen.gpu.name)
    raw = derive_profile(gen, engine, s.trainer)
    cap = min(s.max_response_len, int(row.max_seq_len) - int(row.prompt_len))
    n = s.prompts_per_step * NEMO_STEPS
    prompts = pd.DataFrame({"prompt_id": np.arange(n), "num_prompt_tokens": np.full(n, int(row.prompt_len))})
    trace = synthesize_to_mean(NEMO_PRESET, s.prompts_per_step, s.samples_per_prompt, NEMO_STEPS, cap,
                               float(row.avg_gen_len), prompts)  # fmt: skip
    rl = RLConfig(prompts_per_step=s.prompts_per_step, samples_per_prompt=s.samples_per_prompt, max_response_len=cap,
                  epochs=1, max_steps=NEMO_STEPS, use_kl_loss=s.use_kl_loss)  # fmt: skip
    cluster = ClusterConfig(num_gpus=s.num_gpus, profile=raw["name"], placement=s.placement, train_gpus=s.train_gpus)
    metrics = pd.DataFrame([{"step": k, "timing_s/step": float(row.step_s)} for k in range(1, NEMO_STEPS + 1)])
    run = LoggedRun(f"{row.release} {row.model} {row.policy} {row.gpus}", trace, s.policy, cluster, rl, engine, raw,
                    metrics, "the stand-in at the row's published mean")  # fmt: skip
    return calibrate([run], bootstrap=200)


def nemo_rl() -> list[dict]:
    """NeMo RL's rows of one model, GPU and release (step only): each calibrated on in turn, the
    others predicted (`nemo_rl.simulate_row` at the calibrated terms)."""
    from rlsim.package_data.nemo_rl import load_rows, simulate_row

    d = load_rows()
    d = d[d.expressible]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for (release, model, gpu), group in d.groupby(["release", "model", "gpu"]):
            if len(group) < 2:
                continue
            for i, src in group.iterrows():
                cal = _nemo_rl_calibration(src)
                for j, other in group.iterrows():
                    if j == i:
                        continue
                    got = simulate_row(other, Path(tmp), Terms(**cal.terms))
                    out.append({"release": str(release), "model": model, "gpu": gpu,
                                "calibrated_on": f"{src.policy}, {src.gpus} GPUs",
                                "term": ", ".join(f"{k} {v:.3g}" for k, v in cal.terms.items()) or "none kept",
                                "run": f"{other.policy}, {other.gpus} GPUs", "published": float(other.step_s),
                                "rlsim": got["simulated_s"], "error_pct": 100 * got["error"]})  # fmt: skip
    return out


def nemo_rl_table(rows: list[dict]) -> str:
    lines = ["| release | model | GPU | calibrated on | its term | predicted | published (s) | rlsim (s) | error |",
             "|---|---|---|---|---|---|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['release']} | {r['model']} | {r['gpu'].upper()} | {r['calibrated_on']} | {r['term']} | "
                     f"{r['run']} | {r['published']:.1f} | {r['rlsim']:.1f} | {r['error_pct']:+.0f}% |")
    errs = [abs(r["error_pct"]) for r in rows]
    lines.append(f"| all | | | | | {len(errs)} predictions | | median {statistics.median(errs):.0f}% | "
                 f"worst {max(errs):.0f}% |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    data = build()
    if "--readme" in argv:
        OUT.write_text(transfer_json(data))
    out = tables(data) | {"transfer_nemo_rl": nemo_rl_table(nemo_rl())}
    for name, body in out.items():
        emit(name, body, argv)
    if not {"--markdown", "--readme"} & set(argv):
        print("\n".join(out.values()))
        print(json.dumps(data["calibrations"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
