"""`rlsim calibrate`: measure a real engine, then fit a profile with its measured error.

`decode`, `spec`, `train` and `ops` measure, where the GPUs and vLLM are (`rlsim.measure`), into
one records directory; `fit` turns the records into a profile (`rlsim.calibration.fit`). See
calibrate/README.md. Under torchrun, `ops` measures a TP group:
`torchrun --nproc-per-node N -m rlsim.cli calibrate ops ...`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.table import Table

from rlsim.cli.ui import console as make_console
from rlsim.errors import RlsimError
from rlsim.files import atomic_write_text
from rlsim.text import counted

calibrate_app = typer.Typer(help="Measure a real engine and fit a profile from the records.", no_args_is_help=True)


def _ints(text: str | None, option: str) -> tuple[int, ...] | None:
    """A comma-separated list of positive integers, or None when the option was not given."""
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise RlsimError(f"{option}: expected comma-separated positive integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise RlsimError(f"{option}: expected comma-separated positive integers, got {text!r}")
    return values


@calibrate_app.command()
def decode(
    model: str = typer.Option(..., help="Model directory or Hugging Face id (vLLM loads it)."),
    out: Path = typer.Option(..., "--out", "-o", help="Records directory (one model's records)."),
    tp: int = typer.Option(1, help="Tensor-parallel size of the engine."),
    grid: str = typer.Option("small", help="small (a CPU, a few minutes) or default (a GPU node)."),
    batch_sizes: str | None = typer.Option(None, help="Override the grid's batch sizes, e.g. 1,4,16,64."),
    prompt_lens: str | None = typer.Option(None, help="Override the grid's prompt lengths, e.g. 64,512,2048."),
    output_len: int | None = typer.Option(None, help="Override the grid's output length."),
    seed: int = typer.Option(0, help="Seed of the cells' order and prompts."),
) -> None:
    """Decode iterations of a real vLLM engine over a grid of batch sizes and prompt lengths."""
    from rlsim.calibration.grid import GRIDS, DecodeConfig
    from rlsim.measure.decode import run

    if grid not in GRIDS:
        raise RlsimError(f"unknown grid {grid!r}; grids: {', '.join(sorted(GRIDS))}")
    b, p, n = GRIDS[grid]
    cfg = DecodeConfig(model=model, out=out, tp=tp, batch_sizes=_ints(batch_sizes, "--batch-sizes") or b,
                       prompt_lens=_ints(prompt_lens, "--prompt-lens") or p, output_len=output_len or n,
                       seed=seed)  # fmt: skip
    path = run(cfg)
    make_console().print(f"wrote {path}/facts.json, iterations.parquet, requests.parquet, workload.json")


@calibrate_app.command()
def spec(
    model: str = typer.Option(..., help="Model directory or Hugging Face id (vLLM loads it)."),
    trace: Path = typer.Option(..., help="Trace whose first prompts are run twice, as two visits."),
    out: Path = typer.Option(..., "--out", "-o", help="Records directory (one model's records)."),
    num_prompts: int = typer.Option(16, help="Prompts per visit."),
    max_tokens: int = typer.Option(128, help="Tokens generated per prompt."),
    temperature: float = typer.Option(0.0, help="Sampling temperature."),
    methods: str = typer.Option("histospec,ngram", help="Methods on the second visit: histospec, ngram, suffix."),
    seed: int = typer.Option(0, help="Sampling seed."),
) -> None:
    """Speculative-decoding acceptance under real vLLM: HistoSpec's drafter and vLLM's own."""
    from rlsim.measure.spec import run

    chosen = tuple(m.strip() for m in methods.split(",") if m.strip())
    rec = run(model, trace, out, num_prompts, max_tokens, temperature, chosen, seed=seed)
    make_console().print(
        f"histospec visit 2: mean acceptance length {rec['mean_acceptance_length']:.2f}, "
        f"acceptance rate {rec['acceptance_rate']:.1%}; wrote {out}/spec.json"
    )


@calibrate_app.command()
def train(
    model: str = typer.Option(..., help="Model directory (the run's trainer loads it)."),
    out: Path = typer.Option(..., "--out", "-o", help="Records directory (one model's records)."),
    seq_len: int = typer.Option(128, help="Longest sample (prompt + response) of the synthetic batches."),
    batches: str = typer.Option("4,8,16,32", help="Samples per batch, one measurement each."),
    repeats: int = typer.Option(3, help="Repeats per batch (the median counts)."),
    no_engine: bool = typer.Option(False, "--no-engine", help="Time the weight write only, not a vLLM reload."),
) -> None:
    """The training phases of `rlsim run --real --train grpo`, timed with its own trainer."""
    from rlsim.calibration.grid import check_records_dir
    from rlsim.files import atomic_write_text
    from rlsim.measure.train import measure

    if seq_len < 8 or repeats <= 0:
        raise RlsimError("--seq-len must be at least 8 and --repeats positive")
    sizes = _ints(batches, "--batches")
    out.mkdir(parents=True, exist_ok=True)
    check_records_dir(out, model)
    rec = measure(model, seq_len, sizes, repeats, not no_engine)
    atomic_write_text(out / "train.json", json.dumps(rec, indent=2) + "\n")
    make_console().print(
        f"old_log_prob {rec['forward_s_per_token'] * 1e3:.4g} ms per trained token + {rec['forward_fixed_s']:.3g} s; "
        f"update_actor {rec['seconds_per_token'] * 1e3:.4g} ms per token + {rec['fixed_s']:.3g} s; "
        f"update_weights {rec['weight_sync_s']:.3g} s ({rec['weight_sync_measured']}); wrote {out}/train.json"
    )


@calibrate_app.command()
def ops(
    model: str = typer.Option(..., help="Model directory or config.json (its shapes only; no weights)."),
    out: Path = typer.Option(..., "--out", "-o", help="Records directory to write."),
    tp: int = typer.Option(1, help="Tensor-parallel degree (under torchrun: the world size)."),
    device: str | None = typer.Option(None, help="cuda or cpu (default: cuda when torch sees a GPU)."),
    repeats: int = typer.Option(5, help="Timed repeats per cell (the median counts)."),
    batch_sizes: str | None = typer.Option(None, help="Decode batch sizes, e.g. 1,8,64,256."),
    context_lens: str | None = typer.Option(None, help="KV context lengths per request, e.g. 512,4096."),
    prefill_lens: str | None = typer.Option(None, help="Prefill chunk lengths, e.g. 512,2048."),
    gpu_memory_utilization: float = typer.Option(0.9, help="vLLM's share of GPU memory (the KV capacity)."),
) -> None:
    """Torch operator timings of the model's decoder layer (no vLLM): a profile where vLLM cannot run."""
    import os

    from rlsim.measure.ops import measure
    from rlsim.paths import check_output_dir

    if repeats < 1:
        raise RlsimError(f"--repeats must be >= 1, got {repeats}")
    if not 0 < gpu_memory_utilization <= 1:
        raise RlsimError(f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization}")
    if device not in (None, "cuda", "cpu"):
        raise RlsimError(f"--device must be cuda or cpu, got {device!r}")
    check_output_dir(out, "--out")
    facts = measure(model, out, tp=tp, device=device, repeats=repeats, batches=_ints(batch_sizes, "--batch-sizes"),
                    contexts=_ints(context_lens, "--context-lens"), prefill=_ints(prefill_lens, "--prefill-lens"),
                    gpu_memory_utilization=gpu_memory_utilization)  # fmt: skip
    if int(os.environ.get("RANK", "0")) == 0:
        make_console().print(f"wrote {out}/facts.json, iterations.parquet, train.json ({facts['hardware']}); "
                             f"next: rlsim calibrate fit {out}")  # fmt: skip


@calibrate_app.command()
def fit(
    records: Path = typer.Argument(..., help="Records written by rlsim calibrate decode, spec, train or ops."),
    out: Path = typer.Option(..., "--out", "-o", help="Profile JSON to write."),
    max_mape: float = typer.Option(
        0.15,
        help="Refuse a profile whose held-out MAPE exceeds this, unless the grid's repeat noise "
        "explains all but half of it.",
    ),
    force: bool = typer.Option(False, "--force", help="Write the profile even above --max-mape."),
    name: str | None = typer.Option(None, help="Profile name (default: calibrated-<model>-tp<N>)."),
    seed: int = typer.Option(0, help="Seed of the held-out split."),
) -> None:
    """Least-squares fit of the iteration model; held-out MAPE; replay of the workload phase."""
    from rlsim.calibration.fit import build_profile, fit_gate, fit_iterations, load_records, with_workload_replay
    from rlsim.paths import check_output_file

    check_output_file(out, "--out")
    if not 0 < max_mape < 10:
        raise RlsimError(f"max_mape must be a positive fraction, got {max_mape}")
    rec = load_records(records)
    result = fit_iterations(rec.iterations, seed=seed)
    prof, replay = with_workload_replay(rec, build_profile(rec, result, name))
    console = make_console()
    _print_fit(console, records, rec, prof, result, replay)
    note = fit_gate(result, max_mape, force)  # refused in one sentence above the gate, unless noise explains it
    if note:
        console.print(f"note: {note}")
    atomic_write_text(out, json.dumps(prof, indent=2) + "\n")
    console.print(f"wrote {out}")


def _print_fit(console, records: Path, rec, prof: dict, result, replay: tuple[float, float] | None) -> None:  # noqa: ANN001
    """The fitted coefficients, the held-out errors, the host's load and the workload replay."""
    table = Table(
        title=f"iteration model fitted to {records} ({rec.facts['hardware']}, "
        + (f"vLLM {rec.facts['vllm_version']})" if rec.facts.get("vllm_version") else "torch operator timings)")
    )
    table.add_column("coefficient")
    table.add_column("value", justify="right")
    units = {"t_w_s": ("T_w", 1e3, "ms"), "alpha_s": ("alpha", 1e6, "us/seq"), "beta_s": ("beta", 1e9, "ns/KV token"),
             "gamma_s": ("gamma", 1e6, "us/token"), "prefill_s_per_token": ("prefill", 1e6, "us/token"),
             "prefill_request_s": ("per prefilling request", 1e6, "us/request")}  # fmt: skip
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
    by_total = ", ".join(f"B {k}: {v:+.1%}" for k, v in result.total_error_by_batch.items())
    console.print(f"held-out total time error {result.heldout_total_error:+.1%} ({by_total})")
    if replay is not None:
        wr = prof["fit_error"]["workload_replay"]
        (measured, simulated), totals = replay, wr["measured_totals_s"]
        console.print(
            f"workload replay: measured {measured:.3f} s (median of {len(totals)} repeats, "
            f"{min(totals):.3f}-{max(totals):.3f} s, spread {wr['repeat_spread']:.1%}), "
            f"simulated {simulated:.3f} s, error {simulated / measured - 1:+.1%}"
            + (f"; host load average {wr['load_average'][0]:.1f}" if wr.get("load_average") else "")
        )
    if rec.spec:
        console.print(
            f"speculative ({rec.spec.get('method')}): mean acceptance length "
            f"{rec.spec.get('mean_acceptance_length', 0):.2f}, acceptance rate {rec.spec.get('acceptance_rate', 0):.1%}"
        )
    for note in result.notes:
        console.print(f"note: {note}")


@calibrate_app.command("run")
def run_(
    ctx: typer.Context,
    from_: list[str] = typer.Option(
        ...,
        "--from",
        help="A logged run's config: verl:CONFIG or nemo-rl:RECIPE.yaml; repeat it with --metrics for "
        "several runs of one cluster, fitted jointly.",
    ),
    metrics: list[Path] = typer.Option(
        ...,
        help="The run's per-step metrics, one per --from, in order: veRL's file-logger JSON Lines or console "
        "log, an rlsim run directory, NeMo RL's TensorBoard event files or their JSON dump.",
    ),
    trace: list[Path] | None = typer.Option(
        None,
        help="The run's own lengths as a trace, one per --from (default: a stand-in at each log's mean "
        "response and clip share, named in the output).",
    ),
    gpu: str | None = typer.Option(None, help="The GPU the runs ran on (rlsim profile list), to derive the profile."),
    model: str | None = typer.Option(None, help="The model, where the config names only a local path."),
    profile: str | None = typer.Option(None, help="A measured profile (rlsim calibrate) instead of --gpu/--model."),
    dtype: str = typer.Option("bf16", "--dtype", help="Weights and KV cache, where the config does not say."),
    out: Path = typer.Option(..., "--out", "-o", help="The terms file to write (then --terms FILE)."),
    hold_out_every: int = typer.Option(4, help="Hold every k-th step after the first out of the fit, to report on."),
    bootstrap: int = typer.Option(1000, help="Bootstrap resamples for each term's 90% interval."),
    seed: int = typer.Option(0, help="Seed of the bootstrap."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --out file."),
    as_json: bool = typer.Option(False, "--json", help="Print the terms file as JSON instead of tables."),
) -> None:
    """Fit the framework terms on your own logged runs (rlsim.calibration.run): each term only from
    the phases that identify it, with its 90% interval and the held-out steps' residual."""
    from rlsim import __version__
    from rlsim.calibration.run import calibrate
    from rlsim.cli.options import refuse_overwrite

    refuse_overwrite(out, force)
    if len(metrics) != len(from_):
        raise RlsimError(f"give one --metrics per --from ({len(from_)} --from, {len(metrics)} --metrics), in order")
    if trace and len(trace) != len(from_):
        raise RlsimError(f"give one --trace per --from ({len(from_)} --from, {len(trace)} --trace), or none")
    opts = {"gpu": gpu, "model": model, "profile": profile, "dtype": dtype, "terms": None}
    runs = [_logged_run(ctx, spec, path, trace[i] if trace else None, opts) for i, (spec, path) in
            enumerate(zip(from_, metrics, strict=True))]  # fmt: skip
    err = make_console(__import__("sys").stderr)
    with err.status("calibrating") as status:
        cal = calibrate(runs, hold_out_every, bootstrap, seed, progress=lambda m: status.update(m))
    data = cal.to_json(__version__)
    atomic_write_text(out, json.dumps(data, indent=2) + "\n")
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    _print_calibration(cal, out)


def _logged_run(ctx: typer.Context, spec: str, metrics: Path, trace: Path | None, opts: dict):  # noqa: ANN202
    """One --from/--metrics pair as the simulator replays it (`rlsim.calibration.run.LoggedRun`)."""
    from rlsim.calibration.run import LoggedRun
    from rlsim.cli.from_config import apply_from
    from rlsim.config import ClusterConfig, EngineConfig, RLConfig
    from rlsim.files import read_json_object
    from rlsim.real.run_metrics import read_run_metrics
    from rlsim.real.validate_verl import stand_in_lengths
    from rlsim.trace.format import load

    real, fmt = read_run_metrics(metrics)
    for note in real.attrs.get("notes") or ():  # what the metrics file held that was skipped or superseded
        make_console(sys.stderr).print(f"note: {note}", highlight=False, soft_wrap=True)
    opts, engine, setup = apply_from(ctx, spec, dict(opts), EngineConfig())
    if trace is not None:
        lengths, text = load(trace), f"the run's own ({trace})"
    else:
        lengths, text = stand_in_lengths(real, metrics, setup, setup.policy, "--trace")
    cluster = ClusterConfig(num_gpus=setup.num_gpus, profile=opts["profile"], placement=setup.placement,
                            train_gpus=setup.train_gpus)  # fmt: skip
    rl = RLConfig(prompts_per_step=setup.prompts_per_step, samples_per_prompt=setup.samples_per_prompt,
                  max_response_len=setup.max_response_len, epochs=len(lengths.epochs), max_steps=len(real),
                  use_kl_loss=setup.use_kl_loss, max_model_len=setup.max_model_len)  # fmt: skip
    return LoggedRun(f"{metrics.name} ({fmt})", lengths, setup.policy, cluster, rl, engine,
                     read_json_object(Path(opts["profile"])), real, text)  # fmt: skip


def _print_calibration(cal, out: Path) -> None:  # noqa: ANN001 - rlsim.calibration.run.Calibration
    """The terms kept and refused, the held-out residual per phase, and what it rests on."""
    con = make_console()
    terms = Table(title=f"terms ({cal.fitted_on()})", title_justify="left")
    for col in ("term", "value", "90% interval", "or why not"):
        terms.add_column(col)
    for name, value in cal.terms.items():
        lo, hi = cal.intervals[name]
        terms.add_row(name, f"{value:.4g}", f"{lo:.4g} to {hi:.4g}", "")
    for name, why in cal.refused.items():
        terms.add_row(name, "-", "-", f"not written: {why}; it keeps the profile's value")
    con.print(terms)
    held = Table(title="held-out steps: simulated at these terms against the log", title_justify="left")
    for col in ("phase", "steps", "median |error|", "worst |error|", "error of the sum"):
        held.add_column(col, justify="left" if col == "phase" else "right")
    for phase, r in cal.held_out.items():
        held.add_row(phase, str(r["steps"]), f"{r['median_abs_pct']:.1f}%", f"{r['worst_abs_pct']:.1f}%",
                     f"{r['sum_pct']:+.1f}%")  # fmt: skip
    con.print(held)
    for r in cal.runs:
        con.print(f"{r['name']}: {counted(r['steps'], 'step')}, {r['policy']}, profile {r['profile']}; "
                  f"lengths: {r['lengths']}",
                  highlight=False, soft_wrap=True)  # fmt: skip
    for note in cal.notes:
        con.print(note, highlight=False, soft_wrap=True)
    con.print(f"wrote {out}: give it as --terms {out} to simulate, compare, plan or validate", highlight=False)
