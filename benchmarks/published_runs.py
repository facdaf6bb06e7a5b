"""rlsim against NeMo RL's published step times: every row it can express, simulated from its recipe
as published (read by `--from nemo-rl:`'s reader), with the error; the rows it cannot express,
with the reason.

    python benchmarks/published_runs.py [--rows N] [--fit] [--markdown | --readme]
    python benchmarks/published_runs.py --units sequence,expert,hop   # choose the second term's unit

Three tables: every row (`published_runs`), the k-step off-policy rows predicted apart
(`published_async`), and the summary the README shows (`accuracy_summary`: which rows the terms
were fitted on and which they predict).

How each row is set up, and which terms are fitted on which half, is `benchmarks/nemo_rl.py`.
`--fit` re-fits the terms on the fit half and rewrites `rlsim/derive/terms_nemo-rl.json`.
`--units` prints each candidate unit's two-fold cross-validated loss inside the fit half (the test
half is not read); the unit with the lower one is `nemo_rl.SHIPPED_UNIT`, the one `--fit` uses.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

import pandas as pd
from nemo_rl import FITTED, UNITS, Terms, cross_validate, fit, load_rows, parts, run, run_setup
from readme_tables import emit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=0)
    ap.add_argument("--fit", action="store_true", help="Fit the terms on the fit half; rewrite the terms file.")
    ap.add_argument("--units", help=f"Cross-validate these units of the second term ({', '.join(UNITS)}); print, exit.")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--readme", action="store_true")
    a = ap.parse_args()
    d = load_rows()
    if a.units:
        unknown = sorted(set(a.units.split(",")) - set(UNITS))
        if unknown:
            ap.error(f"unknown unit {unknown[0]!r}; choose from {', '.join(UNITS)}")
        for unit in a.units.split(","):
            loss = cross_validate(d, unit)
            print(f"{unit}: two-fold cross-validated loss inside the fit half {loss:.5f}", flush=True)
        return
    todo = d[d.expressible]
    if a.rows:
        todo = todo.head(a.rows)
    if a.fit:
        terms, loss = fit(d)
        FITTED.write_text(json.dumps({
            "terms": asdict(terms), "fit_loss_mean_sq_log_error": round(loss, 5),
            "fitted_on": "the fit half of benchmarks/published_runs/rows.csv (configurations alternating within each "
            "model, committed before fitting; the configurations generation across nodes added alternate among "
            "themselves), mean squared log error of the mean step time over steps 2-5",
            "rows": int(((d.half == "fit") & d.expressible).sum()),
            "source": "NeMo RL performance summary v0.4, v0.5, v0.6 (github.com/NVIDIA-NeMo/RL, "
            "docs/about/performance-summary.md)",
        }, indent=2) + "\n")  # fmt: skip
    terms = Terms(**json.loads(FITTED.read_text())["terms"]) if FITTED.exists() else Terms()
    derived = run(todo, Terms(), say=True)
    fitted = run(todo, terms, say=True)
    res = d.join(derived.add_prefix("derived_")).join(fitted)
    lines = ["| release | system | model | policy | GPUs | gen TP | train TP/CP/EP/PP | published (s) | derived (s) "
             "| fitted (s) | gen / log-prob / train / refit (s) | error derived | error fitted | half |",
             "|---|---|---|---|---:|---:|---|---:|---:|---:|---|---:|---:|---|"]  # fmt: skip
    for _, r in res.sort_values(["model", "system", "policy", "gpus", "release"]).iterrows():
        if not r.expressible or pd.isna(r.error):
            continue
        lines.append(
            f"| {r.release} | {r.gpu}{' fp8' if r.precision == 'fp8' else ''} | {r.model} | {r.policy} | {r.gpus} | "
            f"{r.gen_tp} | {r.train_tp}/{r.train_cp}/{r.train_ep}/{r.train_pp} | {r.step_s:.1f} | "
            f"{r.derived_simulated_s:.1f} | {r.simulated_s:.1f} | {r.gen:.0f} / {r.old_log_prob:.0f} / "
            f"{r.update_actor:.0f} / {r.update_weights:.1f} | {r.derived_error:+.0%} | {r.error:+.0%} | {r.half}"
            f"{' (added)' if isinstance(r.added, str) and r.added else ''} |"
        )
    summary = [f"Terms ({FITTED.name}): {', '.join(f'{k} {v:.4g}' for k, v in asdict(terms).items() if v)}"]
    for name, part in parts(res):
        summary.append(
            f"{name}: {len(part)} rows; fitted: median |error| {part.error.abs().median():.0%}, worst "
            f"{part.error.abs().max():.0%}; derived, no term fitted: median "
            f"{part.derived_error.abs().median():.0%}, worst {part.derived_error.abs().max():.0%}"
        )
    excluded = d[~d.expressible].reason.str.split(":").str[0].value_counts()
    summary.append(f"{len(d)} published rows, {int(d.expressible.sum())} expressible; excluded: "
                   + "; ".join(f"{n} x {why}" for why, n in excluded.items()))  # fmt: skip
    body = "\n".join(lines) + "\n\n" + "\n\n".join(summary) + "\n"
    emit("published_runs", body, sys.argv)
    if not (a.markdown or a.readme):
        print(body)
    # k-step off-policy rows (k > 1): NeMo RL's async GRPO as k_step_off(k), predicted with the
    # shipped terms and never fitted to (they came in after the fit, outside both halves)
    apart = d[d.reason.str.contains("predicted apart", na=False)] if not a.rows else d.iloc[:0]
    got = None
    if len(apart):
        got = apart.join(run(apart, Terms(), say=True).add_prefix("derived_")).join(run(apart, terms, say=True))
        rows = ["| release | system | model | policy | rlsim policy | GPUs (gen + train) | published (s) | derived (s) "
                "| fitted terms (s) | gen / log-prob / train / refit (s) | error derived | error fitted |",
                "|---|---|---|---|---|---|---:|---:|---:|---|---:|---:|"]  # fmt: skip
        for _, r in got.iterrows():
            rows.append(
                f"| {r.release} | {r.gpu} | {r.model} | {r.policy} | `{run_setup(r).policy}` | {r.gen_gpus} + "
                f"{r.gpus - r.gen_gpus} | {r.step_s:.1f} | {r.derived_simulated_s:.1f} | {r.simulated_s:.1f} | "
                f"{r.gen:.0f} / {r.old_log_prob:.0f} / {r.update_actor:.0f} / {r.update_weights:.1f} | "
                f"{r.derived_error:+.0%} | {r.error:+.0%} |"
            )
        emit("published_async", "\n".join(rows) + "\n", sys.argv)
        if not (a.markdown or a.readme):
            print("\n".join(rows))
    summary = accuracy_summary(res, got)
    emit("accuracy_summary", summary, sys.argv)
    if not (a.markdown or a.readme):
        print(summary)


def accuracy_summary(res: pd.DataFrame, apart: pd.DataFrame | None) -> str:
    """Mean step time against NeMo RL's published runs, by role: the half the four terms were
    fitted on, the half they predict (and its two sets apart), and the rows that came in after the fit."""
    lines = ["| NeMo RL published rows | role | rows | median abs error, fitted terms | worst | median abs error, "
             "derived (no term fitted) | worst |", "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    roles = [(name, "fitted on" if name == "fit half" else "predicted", part) for name, part in parts(res)]
    if apart is not None and len(apart):
        roles.append(("k-step off-policy, after the fit", "predicted", apart))
    for name, role, part in roles:
        lines.append(
            f"| {name} | {role} | {len(part)} | {part.error.abs().median():.0%} | {part.error.abs().max():.0%} | "
            f"{part.derived_error.abs().median():.0%} | {part.derived_error.abs().max():.0%} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
