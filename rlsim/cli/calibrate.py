"""`rlsim calibrate fit`: turn calibration records into a profile, with its measured error.

The measuring itself runs where the GPUs and vLLM are: `python -m calibrate.decode`,
`python -m calibrate.spec`, `python -m calibrate.train` (see calibrate/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from rlsim.cli.ui import console as make_console
from rlsim.errors import RlsimError
from rlsim.files import atomic_write_text

calibrate_app = typer.Typer(help="Fit profiles from calibration records.", no_args_is_help=True)


@calibrate_app.command()
def fit(
    records: Path = typer.Argument(..., help="Records directory written by calibrate.decode (+ spec, train)."),
    out: Path = typer.Option(..., "--out", "-o", help="Profile JSON to write."),
    max_mape: float = typer.Option(
        0.15, help="Refuse a profile whose held-out MAPE exceeds this, unless the grid's repeat noise "
        "explains all but half of it."
    ),
    force: bool = typer.Option(False, "--force", help="Write the profile even above --max-mape."),
    name: str | None = typer.Option(None, help="Profile name (default: calibrated-<model>-tp<N>)."),
    seed: int = typer.Option(0, help="Seed of the held-out split."),
) -> None:
    """Least-squares fit of the iteration model; held-out MAPE; replay of the workload phase."""
    from calibrate.fit import build_profile, fit_iterations, load_records, replay_workload
    from rlsim.paths import check_output_file

    check_output_file(out, "--out")
    if not 0 < max_mape < 10:
        raise RlsimError(f"max_mape must be a positive fraction, got {max_mape}")
    rec = load_records(records)
    result = fit_iterations(rec.iterations, seed=seed)
    prof = build_profile(rec, result, name)
    replay = replay_workload(rec, prof)
    if replay is not None:
        measured, simulated = replay
        totals = [float(t) for t in rec.workload.get("measured_totals_s", [measured])]
        prof["fit_error"]["workload_replay"] = {
            "measured_s": round(measured, 4),
            "measured_totals_s": [round(t, 4) for t in totals],
            # The instrument's own noise: a replay error well inside it says nothing either way.
            "repeat_spread": round(max(totals) / min(totals) - 1.0, 4),
            "simulated_s": round(simulated, 4),
            "error": round(simulated / measured - 1.0, 4),
            "load_average": rec.workload.get("load_average"),
        }
    console = make_console()
    table = Table(
        title=f"iteration model fitted to {records} ({rec.facts['hardware']}, "
        + (f"vLLM {rec.facts['vllm_version']})" if rec.facts.get("vllm_version") else "torch operator timings)")
    )
    table.add_column("coefficient")
    table.add_column("value", justify="right")
    units = {"t_w_s": ("T_w", 1e3, "ms"), "alpha_s": ("alpha", 1e6, "us/seq"), "beta_s": ("beta", 1e9, "ns/KV token"),
             "gamma_s": ("gamma", 1e6, "us/token"), "prefill_s_per_token": ("prefill", 1e6, "us/token")}  # fmt: skip
    for key, (label, mul, unit) in units.items():
        table.add_row(label, f"{prof[key] * mul:.4g} {unit}")
    table.add_row("KV capacity", f"{prof['kv_capacity_tokens']:,} tokens")
    console.print(table)
    by = ", ".join(f"B {k}: {v:.1%}" for k, v in result.mape_by_batch.items())
    console.print(f"held-out MAPE {result.mape:.1%} over {result.n_holdout} iterations ({by})")
    if result.noise is not None:
        console.print(f"the grid's repeat noise: {result.noise:.1%} (the MAPE a perfect model would still pay)")
    load = rec.facts.get("host_load")
    if load:
        from rlsim.hostload import describe

        console.print(f"host load during the grid: {describe(load)}")
    console.print(f"held-out total time error {result.heldout_total_error:+.1%}")
    if replay is not None:
        wr = prof["fit_error"]["workload_replay"]
        totals = wr["measured_totals_s"]
        console.print(
            f"workload replay: measured {replay[0]:.3f} s (median of {len(totals)} repeats, "
            f"{min(totals):.3f}-{max(totals):.3f} s, spread {wr['repeat_spread']:.1%}), "
            f"simulated {replay[1]:.3f} s, error {replay[1] / replay[0] - 1:+.1%}"
            + (f"; host load average {wr['load_average'][0]:.1f}" if wr.get("load_average") else "")
        )
    if rec.spec:
        console.print(
            f"speculative ({rec.spec.get('method')}): mean acceptance length "
            f"{rec.spec.get('mean_acceptance_length', 0):.2f}, acceptance rate {rec.spec.get('acceptance_rate', 0):.1%}"
        )
    for note in result.notes:
        console.print(f"note: {note}")
    if result.mape > max_mape and not force:
        # Over the gate because the machine was noisy, not because the model is wrong: the
        # error beyond the grid's own repeat noise is what the gate holds the model to.
        if result.noise is not None and result.mape - result.noise <= max_mape / 2:
            console.print(
                f"note: held-out MAPE {result.mape:.1%} exceeds --max-mape {max_mape:.0%}, but the grid's repeat "
                f"noise is {result.noise:.1%}: the model's own error, {result.mape - result.noise:.1%}, is within "
                f"{max_mape / 2:.1%}; fitted anyway (a quieter machine gives a tighter profile)"
            )
        else:
            beyond = "" if result.noise is None else f", {result.mape - result.noise:.1%} beyond the grid's noise"
            raise RlsimError(
                f"held-out MAPE {result.mape:.1%} exceeds --max-mape {max_mape:.0%}{beyond}; profile not written "
                "(measure a larger grid, or pass --force)"
            )
    atomic_write_text(out, json.dumps(prof, indent=2) + "\n")
    console.print(f"wrote {out}")
