"""rlsim against NeMo RL's published step times: every row it can express, simulated from its recipe
as published (read by `--from nemo-rl:`'s reader), with the error; the rows it cannot express,
with the reason.

    python -m doctables.published_runs [--rows N] [--fit] [--markdown | --readme]
    python -m doctables.published_runs --units sequence,expert,hop   # choose the second term's unit
    python -m doctables.published_runs --term-sets                   # choose which terms ship

The k-step off-policy rows are predicted apart (`published_async`), and the summary the README
shows (`accuracy_summary`) says which rows the terms were fitted on and which validate them.

How each row is set up, and which terms are fitted on which half, is `rlsim/package_data/nemo_rl.py`.
`--term-sets` cross-validates, by two folds inside the fit half, the derived profile (no term),
the four terms and each set of three, and writes the losses and the set that ships (the lowest
loss; a set within 5% of it ties, and the smaller ships) to
`published_runs/term_sets.json`; about 30 min on a 2-core machine with `--jobs 2`.
`--fit` fits that set on the fit half and rewrites `rlsim/derive/terms_nemo-rl.json` (by
`rlsim.package_data.terms`, which `python -m rlsim.package_data terms` runs), then the tables.
Four tables: every row (`published_runs`, with each stand-in's scale and its share of responses at
the cap), the rows whose stand-in has more than a quarter at the cap again at their mean -10% and
+10% (`published_sensitivity`), the k-step rows, and the summary.
`--units` prints each candidate unit's two-fold cross-validated loss inside the fit half (the
validation half is not read); the unit with the lower one is `nemo_rl.SHIPPED_UNIT`, the unit
`--term-sets` gives the second term.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

import pandas as pd

from rlsim.package_data import terms as terms_file
from rlsim.package_data.markers import emit
from rlsim.package_data.nemo_rl import FITTED, UNITS, Terms, cross_validate, load_rows, parts, run, run_setup

HALF = {"fit": "fit", "test": "validation"}  # rows.csv's half, as the tables name it
AT_CAP_MARK = 0.25  # a stand-in with more of its responses at the cap is marked: its tail is the cap's, not the run's


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=0)
    ap.add_argument("--fit", action="store_true", help="Fit the terms on the fit half; rewrite the terms file.")
    ap.add_argument("--units", help=f"Cross-validate these units of the second term ({', '.join(UNITS)}); print, exit.")
    ap.add_argument("--term-sets", action="store_true", help="Cross-validate which terms ship (two folds inside the "
                    "fit half, on a pool of --jobs processes); write published_runs/term_sets.json, exit.")
    ap.add_argument("--jobs", type=int, default=2)
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
    if a.term_sets:
        chosen = terms_file.term_sets(a.jobs)
        for name, loss in chosen["losses"].items():
            print(f"{name}: {loss:.5f}{'  <- ships' if name == chosen['chosen'] else ''}")
        return
    todo = d[d.expressible]
    if a.rows:
        todo = todo.head(a.rows)
    if a.fit:
        terms_file.write(a.jobs)
    terms = Terms(**json.loads(FITTED.read_text())["terms"])  # the shipped terms (committed: no fallback)
    derived = run(todo, Terms(), say=True)
    fitted = run(todo, terms, say=True)
    res = d.join(derived.add_prefix("derived_")).join(fitted)
    lines = ["| release | system | model | policy | GPUs | gen TP | trainer TP/CP/EP/PP | published (s) "
             "| derived (s) | fitted (s) | gen / log-prob / train / refit (s) | error derived | error fitted "
             "| stand-in: scale, at cap | half |",
             "|---|---|---|---|---:|---:|---|---:|---:|---:|---|---:|---:|---|---|"]  # fmt: skip
    for _, r in res.sort_values(["model", "system", "policy", "gpus", "release"]).iterrows():
        if not r.expressible or pd.isna(r.error):
            continue
        lines.append(
            f"| {r.release} | {r.gpu}{' fp8' if r.precision == 'fp8' else ''} | {r.model} | {r.policy} | {r.gpus} | "
            f"{r.gen_tp} | {r.backend} {r.train_tp}/{r.train_cp}/{r.train_ep}/{r.train_pp} | {r.step_s:.1f} | "
            f"{r.derived_simulated_s:.1f} | {r.simulated_s:.1f} | {r.gen:.0f} / {r.old_log_prob:.0f} / "
            f"{r.update_actor:.0f} / {r.update_weights:.1f} | {r.derived_error:+.0%} | {r.error:+.0%} | "
            f"x{r.length_scale:.2f}, {r.at_cap:.0%}{' (over 25%)' if r.at_cap > AT_CAP_MARK else ''} | {HALF[r.half]}"
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
    if not a.rows:
        body = sensitivity(res, terms)
        emit("published_sensitivity", body, sys.argv)
        if not (a.markdown or a.readme):
            print(body)
    if not a.rows:
        body = term_sets_table()
        emit("term_sets", body, sys.argv)
        if not (a.markdown or a.readme):
            print(body)
    summary = accuracy_summary(res, got)
    emit("accuracy_summary", summary, sys.argv)
    if not (a.markdown or a.readme):
        print(summary)


def term_sets_table() -> str:
    """The cross-validation that chose which terms ship (`--term-sets`, `terms_file.TERM_SETS_FILE`), as a table."""
    got = json.loads(terms_file.TERM_SETS_FILE.read_text())
    second = {"expert": "per routed token-expert pair per MoE layer", "sequence": "per running sequence per layer",
              "hop": "per network hop across scale-up domains"}[got["unit"]]  # fmt: skip
    names = {"layer": "per decoder layer per iteration", "second": second,
             "refit": "per refit tensor", "mfu": "Megatron's dense MFU"}  # fmt: skip
    lines = ["| terms fitted | which | two-fold cross-validated loss inside the fit half | ships |",
             "|---|---|---:|---|"]  # fmt: skip
    for name, loss in got["losses"].items():
        which = ", ".join(names[t] for t in got["terms"][name]) or "none: the derived profile"
        lines.append(f"| {name} | {which} | {loss:.4f} | {'yes' if name == got['chosen'] else ''} |")
    return "\n".join(lines) + "\n"


def sensitivity(res: pd.DataFrame, terms: Terms) -> str:
    """The rows whose stand-in puts more than `AT_CAP_MARK` of its responses at the cap, their step
    with the stand-in's mean 10% lower and higher: NeMo RL publishes no clip share, so how much of
    the step rides on the tail's shape at the cap is shown, not assumed."""
    rows = res[res.expressible & (res.at_cap > AT_CAP_MARK)]
    lines = ["| release | system | model | policy | GPUs | at cap | published (s) | derived: mean -10% / at it / "
             "+10% (s) | fitted: mean -10% / at it / +10% (s) | half |",
             "|---|---|---|---|---:|---:|---:|---|---|---|"]  # fmt: skip
    low_d, high_d = (run(rows, Terms(), mean_scale=k) for k in (0.9, 1.1))
    low_f, high_f = (run(rows, terms, mean_scale=k) for k in (0.9, 1.1))
    for i, r in rows.sort_values(["model", "system", "policy", "gpus", "release"]).iterrows():
        lines.append(
            f"| {r.release} | {r.gpu} | {r.model} | {r.policy} | {r.gpus} | {r.at_cap:.0%} | {r.step_s:.1f} | "
            f"{low_d.simulated_s[i]:.1f} / {r.derived_simulated_s:.1f} / {high_d.simulated_s[i]:.1f} | "
            f"{low_f.simulated_s[i]:.1f} / {r.simulated_s:.1f} / {high_f.simulated_s[i]:.1f} | {HALF[r.half]} |"
        )
    return "\n".join(lines) + "\n"


def accuracy_summary(res: pd.DataFrame, apart: pd.DataFrame | None) -> str:
    """Mean step time against NeMo RL's published runs, by role: the half the four terms were
    fitted on, the half they predict (and its two sets apart), and the rows that came in after the fit."""
    lines = ["| NeMo RL published rows | role | rows | median abs error, fitted terms | worst | median abs error, "
             "derived (no term fitted) | worst |", "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    roles = [(name, "fitted on" if name == "fit half" else "validation (held back from every fit)", part)
             for name, part in parts(res)]  # fmt: skip
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
