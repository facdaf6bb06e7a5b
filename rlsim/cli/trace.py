"""`rlsim trace ...`: generate, inspect, import and compare step traces."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from rlsim.cli.options import refuse_overwrite
from rlsim.cli.ui import console as make_console
from rlsim.errors import RlsimError

trace_app = typer.Typer(help="Generate, inspect, import and compare step traces.", no_args_is_help=True)


# Names of the shipped presets; a test checks they match `rlsim.trace.presets.PRESETS` (kept apart so
# `--help` does not import scipy).
PRESET_NAMES = ("dapo-qwen2.5-32b", "reasoning-32k")


class ImportFormat(str, Enum):
    auto = "auto"
    polytrace = "polytrace"
    polytrace_multiturn = "polytrace_multiturn"
    verl = "verl"
    slime = "slime"


def _fmt(v: object, metric: str = "") -> str:
    if v is None:
        return "-"
    if metric in ("clip_ratio", "clipped_group_share"):
        return f"{100 * v:.2f}%"
    if metric in ("within_prompt_cv", "cross_epoch_spearman", "prompt_share", "ks_distance"):
        return f"{v:.3f}"
    if isinstance(v, float):
        return f"{v:,.0f}"
    return f"{v:,}"


def _stats_table(stats, title: str) -> Table:  # noqa: ANN001 - TraceStats, imported lazily
    table = Table(title=title, title_justify="left")
    cols = [
        ("epoch", "epoch"),
        ("num_prompts", "prompts"),
        ("num_samples", "samples"),
        ("mean_prompt_tokens", "prompt"),
        ("mean", "mean"),
        ("p50", "p50"),
        ("p90", "p90"),
        ("p99", "p99"),
        ("max", "max"),
        ("clip_ratio", "clip"),
        ("within_prompt_cv", "CV"),
        ("cross_epoch_spearman", "rho_s"),
    ]
    table.caption = (
        "prompt: mean prompt tokens; clip: share cut at max_response_len; CV: median "
        "within-prompt std/mean; rho_s: Spearman of prompt mean length vs the previous epoch"
    )
    for _, label in cols:
        table.add_column(label, justify="right")
    for s in (*stats.epochs, stats.overall):
        cells = ["all" if s.epoch is None else str(s.epoch)]
        cells += [_fmt(getattr(s, key), key) for key, _ in cols[1:]]
        table.add_row(*cells, style="bold" if s.epoch is None else None)
    return table


def _print_stats(trace, path: Path, console: Console) -> None:  # noqa: ANN001
    from rlsim.trace.stats import trace_stats

    stats = trace_stats(trace)
    meta = trace.meta
    console.print(
        f"[bold]{path}[/]  model={meta.model}  source={meta.source}  "
        f"max_response_len={meta.max_response_len:,}  samples_per_prompt={meta.samples_per_prompt}"
        + (f"  output_token_ids={meta.output_token_ids}" if meta.output_token_ids else "")
    )
    console.print(_stats_table(stats, "Response length (tokens) per epoch"))
    if "turn_output_tokens" in trace.table.columns:  # a multi-turn trace: its trajectories' shape
        from rlsim.trace.turn_model import trajectory_stats

        t = trajectory_stats(trace)
        console.print(
            f"multi-turn: {t['turns per trajectory']:.2f} turns per trajectory "
            f"({t['share with a tool call']:.0%} call a tool), "
            f"{t['appended tokens per call mean']:,.0f} tokens appended per call, tool latency p50 "
            f"{t['tool latency p50 (s)']:.2f} s / p90 {t['tool latency p90 (s)']:.2f} s, final context "
            f"{t['final context mean']:,.0f} tokens (max_model_len {trace.meta.max_model_len or 0:,}); length = "
            "tokens generated over all turns",
            highlight=False,
        )


@trace_app.command()
def synth(
    out: Path = typer.Option(..., "--out", "-o", help="Output Parquet trace."),
    preset: str = typer.Option(
        "dapo-qwen2.5-32b",
        help=f"Length model: a shipped preset ({', '.join(PRESET_NAMES)}) or a JSON file from `rlsim trace fit`.",
    ),
    prompts: Path | None = typer.Option(
        None,
        help="Prompt table (prompt_id, num_prompt_tokens[, prompt_text]) to draw prompts from.",
    ),
    num_prompts: int | None = typer.Option(None, help="Prompts (default: all of --prompts)."),
    samples_per_prompt: int = typer.Option(16, help="Samples per prompt per visit (R0)."),
    epochs: int = typer.Option(3, help="Visits of every prompt."),
    prompts_per_step: int = typer.Option(512, help="Maps epochs to training steps for growth."),
    max_response_len: int | None = typer.Option(None, help="Cap (default: the preset's)."),
    rho: float | None = typer.Option(None, help="Cross-epoch correlation of a prompt's latent length."),
    prompt_share: float | None = typer.Option(
        None, help="Share of length variance the prompt explains (default: the preset's)."
    ),
    start_step: int = typer.Option(0, help="Training step the trace starts at (lengths grow with steps)."),
    clip_ratio: float | None = typer.Option(
        None, help="Raise the tail so at least this share of responses hit the cap (runaway responses)."
    ),
    length_scale: float = typer.Option(
        1.0, help="Multiply response lengths and the preset's cap (below 1: a small real run on a CPU keeps the shape)."
    ),
    seed: int = typer.Option(0, help="Random seed; same seed, same bytes."),
    token_ids: bool = typer.Option(False, "--token-ids", help="Add synthetic output_token_ids."),
    reuse_fraction: float = typer.Option(0.85, help="Token reuse from the previous visit."),
    vocab_size: int = typer.Option(151_643, help="Vocabulary of synthetic token ids."),
    model: str | None = typer.Option(None, help="Model name in the metadata."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Generate a seeded synthetic trace from a preset fitted to real data."""
    from rlsim.trace.synth import SynthConfig
    from rlsim.trace.turn_model import load_model

    refuse_overwrite(out, force)
    turn_model = load_model(preset)
    if turn_model is not None:  # a multi-turn preset: trajectories of turns and tool calls
        if num_prompts is None:
            raise RlsimError(f"--num-prompts is needed with the multi-turn preset {preset}")
        _generate(out, lambda: _synth_turns(turn_model, num_prompts, samples_per_prompt, epochs, seed))
        return
    config = SynthConfig(
        preset=preset, num_prompts=num_prompts, samples_per_prompt=samples_per_prompt, epochs=epochs,
        prompts_per_step=prompts_per_step, max_response_len=max_response_len, rho=rho, prompt_share=prompt_share,
        start_step=start_step, clip_ratio=clip_ratio, length_scale=length_scale, seed=seed, token_ids=token_ids,
        reuse_fraction=reuse_fraction, vocab_size=vocab_size, model=model,
    )  # fmt: skip
    _generate(out, lambda: _synth_lengths(config, prompts))


def _synth_turns(turn_model, num_prompts: int, samples_per_prompt: int, epochs: int, seed: int):  # noqa: ANN001, ANN202
    from rlsim.trace.turn_model import synthesize

    return synthesize(turn_model, num_prompts, samples_per_prompt, epochs, seed)


def _synth_lengths(config, prompts: Path | None):  # noqa: ANN001, ANN202 - a SynthConfig; a Trace
    from rlsim.trace.synth import load_prompts, synthesize

    return synthesize(config, load_prompts(prompts) if prompts is not None else None)


def _generate(out: Path, make) -> None:  # noqa: ANN001 - () -> Trace
    """Generate the trace under a status line, write it, and print its statistics."""
    from rlsim.trace.format import save

    console = make_console()
    with console.status("generating trace"):
        trace = make()
        save(trace, out)
    _print_stats(trace, out, console)


@trace_app.command()
def task(
    out: Path = typer.Option(..., "--out", "-o", help="Output Parquet trace."),
    name: str = typer.Option(
        "stop-within",
        "--task",
        help="The task (rlsim.trace.tasks): stop-within, or tool-lookup (multi-turn, a local lookup tool).",
    ),
    num_prompts: int = typer.Option(16, help="Prompts."),
    samples_per_prompt: int = typer.Option(8, help="Samples per prompt per visit (R0)."),
    epochs: int = typer.Option(8, help="Visits of every prompt."),
    max_response_len: int = typer.Option(48, help="Response cap."),
    style: str = typer.Option("tiny", help="tiny: calibrate.tiny_model's words; text: English for a real model."),
    seed: int = typer.Option(0, help="Random seed."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Write a built-in verifiable task's trace, for `rlsim run --real --train grpo --lengths free`."""
    from rlsim.trace.format import save
    from rlsim.trace.tasks import task_trace

    refuse_overwrite(out, force)
    trace = task_trace(name, num_prompts, samples_per_prompt, epochs, max_response_len, style, seed)
    save(trace, out)
    t = trace.table  # its lengths are the cap (a free run generates its own), so no length table
    what = (
        f"targets {t['target_len'].min()}-{t['target_len'].max()} tokens"
        if "target_len" in t
        else f"a lookup tool called by the word {trace.meta.source_params['call_word']}, up to "
        f"{trace.meta.source_params['max_turns']} turns"
    )
    make_console().print(
        f"{out}: task {name}, {num_prompts} prompts x {samples_per_prompt} samples x {epochs} epochs, {what}, cap "
        f"{max_response_len} a turn; train on it with rlsim run --real --train grpo --lengths free --trace {out}",
        highlight=False,
    )


@trace_app.command()
def inspect(
    path: Path = typer.Argument(..., help="Parquet trace."),
    plot: Path | None = typer.Option(None, help="Write the per-epoch length CDF to this PNG."),
    as_json: bool = typer.Option(False, "--json", help="Print statistics as JSON."),
) -> None:
    """Per-epoch length statistics: mean, p50/p90/p99, max, clip ratio, CV, Spearman."""
    if plot is not None:
        from rlsim.paths import check_plot_file

        check_plot_file(plot)
    from rlsim.trace.format import load
    from rlsim.trace.stats import plot_length_cdf, trace_stats

    trace = load(path)
    if as_json:
        typer.echo(json.dumps(trace_stats(trace).to_dict(), indent=2))
    else:
        _print_stats(trace, path, make_console())
    if plot is not None:
        plot_length_cdf(trace, plot)
        if not as_json:
            make_console().print(f"length CDF written to {plot}")


@trace_app.command("import")
def import_(
    src: Path = typer.Argument(..., help="Folder of real rollout logs (or a folder holding one run's folder)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output Parquet trace."),
    fmt: ImportFormat = typer.Option(ImportFormat.auto, "--format", help="Log format."),
    tokenizer: Path | None = typer.Option(None, help="Local Hugging Face tokenizer (veRL dumps hold text)."),
    max_response_len: int | None = typer.Option(
        None, help="The run's response cap (default: inferred from responses piled up at one maximum)."
    ),
    model: str | None = typer.Option(
        None, help="Model name in the metadata (default: one named in the log's path, else unknown)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Convert real logs (PolyTrace packed lengths, veRL rollout_data_dir, slime rollout dumps) into a trace."""
    from rlsim.trace.format import save
    from rlsim.trace.importers import import_logs

    refuse_overwrite(out, force)
    imported = import_logs(src, fmt.value, max_response_len, model, tokenizer)
    save(imported.trace, out)
    console = make_console()
    for note in imported.notes:
        style = "yellow" if note.startswith("warning") else "dim"
        console.print(f"[{style}]{note}[/]", highlight=False)
    _print_stats(imported.trace, out, console)


@trace_app.command()
def fit(
    src: Path = typer.Argument(..., help="A Parquet trace, or a folder of real logs (read as `trace import` does)."),
    out: Path = typer.Option(..., "--out", "-o", help="Preset JSON to write (use with `trace synth --preset`)."),
    name: str | None = typer.Option(None, help="Preset name (default: the output file's stem)."),
    max_response_len: int | None = typer.Option(None, help="The run's cap, for logs (default: inferred)."),
    folds: int = typer.Option(
        0, help="Check by K-fold cross-validation: each fold's prompts against a fit to the other folds (0: in-sample)."
    ),
    seed: int = typer.Option(0, help="Seed of the folds and of the check's synthetic draws."),
    steps: str | None = typer.Option(None, help="Multi-turn traces: fit on these logged steps only (e.g. 0-2)."),
    test_steps: str | None = typer.Option(
        None, help="Multi-turn traces: check the fit against these held-out steps (e.g. 3-4; default: the fitting set)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Fit the length generator to your own log: body quantiles, clip mass, prompt share, growth."""
    from rlsim.trace.fit import cross_validate, fit_preset
    from rlsim.trace.fit_check import check_fit
    from rlsim.trace.format import load
    from rlsim.trace.presets import save_preset

    refuse_overwrite(out, force)
    if folds == 1 or folds < 0:
        raise RlsimError(f"--folds must be 0 (in-sample check) or at least 2, got {folds}")
    if out.parent != Path("") and not out.parent.is_dir():
        raise RlsimError(f"{out.parent}: no such directory for the preset file")
    console = make_console()
    if src.is_dir():
        from rlsim.trace.importers import import_logs

        imported = import_logs(src, max_response_len=max_response_len)
        trace = imported.trace
        for note in imported.notes:
            console.print(f"[dim]{note}[/]", highlight=False)
    else:
        trace = load(src)
    name = name or out.name.removesuffix(".json").removesuffix(".preset")
    if "turn_output_tokens" in trace.table.columns:  # a multi-turn trace: the turn generator
        _fit_turns(trace, name, out, steps, test_steps, seed, console)
        return
    with console.status("fitting"):
        preset, notes = fit_preset(trace, name)
        rows = cross_validate(trace, name, folds, seed) if folds else check_fit(preset, trace, seed)
    save_preset(preset, out, notes)
    for note in notes:
        console.print(note, highlight=False)
    what = (
        f"the log, {folds}-fold cross-validated (each fold against a fit to the others)"
        if folds
        else ("the log it was fitted to")
    )
    table = Table(title=f"Fitted generator vs {what}", title_justify="left")
    for col in ("metric", "log", "fitted", "diff"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for r in rows:
        table.add_row(r["metric"], _fmt(r["a"], r["metric"]), _fmt(r["b"], r["metric"]), r["diff"])
    console.print(table)
    console.print(f"preset written to {out}; generate with: rlsim trace synth --preset {out} -o my.parquet ...")


def _step_list(text: str) -> list[int]:
    """'0-2' or '0,1,2' as a list of steps."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            out += list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise RlsimError(f"steps must read like 0-2 or 0,1,2, got {text!r}") from None
    return out


def _fit_turns(trace, name: str, out: Path, steps: str | None, test_steps: str | None, seed: int, console) -> None:  # noqa: ANN001
    """`trace fit` on a multi-turn trace: the turn generator, checked on held-out steps."""
    from rlsim.trace.format import Trace
    from rlsim.trace.turn_model import fit, save_model, synthesize, trajectory_stats

    def part(text: str | None, what: str) -> Trace:
        if text is None:
            return trace
        if "step" not in trace.table.columns:
            raise RlsimError(f"{what} needs a trace with logged steps (a `step` column)")
        want = _step_list(text)
        rows = trace.table[trace.table["step"].isin(want)]
        if rows.empty:
            raise RlsimError(f"{what} {text}: the trace holds none of these steps")
        return Trace(rows.reset_index(drop=True), trace.meta)

    fit_set, test_set = part(steps, "--steps"), part(test_steps, "--test-steps")
    model = fit(fit_set, name)
    n_prompts = int(test_set.table["prompt_id"].nunique())
    synth = synthesize(model, n_prompts, trace.meta.samples_per_prompt, 1, seed)
    save_model(model, out)
    a, b = trajectory_stats(test_set), trajectory_stats(synth)
    where = f"held-out steps {test_steps}" if test_steps else "the trace it was fitted to"
    table = Table(title=f"Multi-turn generator (fitted on {model.fitted_on}) vs {where}", title_justify="left")
    for col in ("metric", "log", "fitted", "diff"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for k, v in a.items():
        table.add_row(k, f"{v:,.2f}", f"{b[k]:,.2f}", f"{100 * (b[k] / v - 1):+.1f}%" if v else "-")
    console.print(table)
    console.print(
        f"preset written to {out}; generate with: rlsim trace synth --preset {out} --num-prompts N -o my.parquet"
    )


@trace_app.command()
def compare(
    a: Path = typer.Argument(..., help="Reference trace."),
    b: Path = typer.Argument(..., help="Trace to compare against the reference."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Length statistics of two traces side by side with relative differences (B vs A)."""
    from rlsim.trace.format import load
    from rlsim.trace.stats import compare_traces

    rows = compare_traces(load(a), load(b))
    if as_json:
        typer.echo(json.dumps({"a": str(a), "b": str(b), "rows": rows}, indent=2))
        return
    table = Table(title=f"A = {a}\nB = {b}", title_justify="left")
    for col in ("scope", "metric", "A", "B", "B vs A"):
        table.add_column(col, justify="left" if col in ("scope", "metric") else "right")
    for r in rows:
        diff = "-" if r["rel_diff"] is None else f"{100 * r['rel_diff']:+.1f}%"
        table.add_row(r["scope"], r["metric"], _fmt(r["a"], r["metric"]), _fmt(r["b"], r["metric"]), diff)
    make_console().print(table)
