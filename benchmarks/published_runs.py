"""rlsim against NeMo RL's published step times: every row it can express, simulated from the row's
stated setup, with the error; the rows it cannot express, with the reason.

    python benchmarks/published_runs.py [--rows N] [--fit] [--markdown | --readme]

How each row is set up, and which terms are fitted on which half, is `benchmarks/nemo_rl.py`.
`--fit` re-fits the terms on the fit half and rewrites `rlsim/derive/terms_nemo-rl.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

import pandas as pd
from nemo_rl import FITTED, Terms, fit, load_rows, run
from readme_tables import emit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=0)
    ap.add_argument("--fit", action="store_true", help="Fit the terms on the fit half; rewrite the terms file.")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--readme", action="store_true")
    a = ap.parse_args()
    d = load_rows()
    todo = d[d.expressible]
    if a.rows:
        todo = todo.head(a.rows)
    if a.fit:
        terms, loss = fit(d)
        FITTED.write_text(json.dumps({
            "terms": asdict(terms), "fit_loss_mean_sq_log_error": round(loss, 5),
            "fitted_on": "the fit half of benchmarks/published_runs/rows.csv (configurations alternating within each "
            "model, committed before fitting), mean squared log error of the mean step time over steps 2-5",
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
            f"{r.update_actor:.0f} / {r.update_weights:.1f} | {r.derived_error:+.0%} | {r.error:+.0%} | {r.half} |"
        )
    summary = [f"Terms ({FITTED.name}): {', '.join(f'{k} {v:.4g}' for k, v in asdict(terms).items() if v is not None)}"]
    for half in ("fit", "test"):
        part = res[(res.half == half) & res.error.notna()]
        if len(part):
            summary.append(
                f"{half} half: {len(part)} rows; fitted: median |error| {part.error.abs().median():.0%}, worst "
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


if __name__ == "__main__":
    main()
