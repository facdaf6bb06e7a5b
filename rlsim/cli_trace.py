"""`rlsim trace ...`: generate, inspect, import and compare step traces."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from rlsim.errors import RlsimError
from rlsim.ui import console as make_console

trace_app = typer.Typer(help="Generate, inspect, import and compare step traces.", no_args_is_help=True)


class PresetName(str, Enum):
    """Choices of --preset; a test checks they match `rlsim.presets.PRESETS` (kept apart so
    `--help` does not import scipy)."""

    dapo_qwen25_32b = "dapo-qwen2.5-32b"
    reasoning_32k = "reasoning-32k"


class ImportFormat(str, Enum):
    auto = "auto"
    polytrace = "polytrace"
    verl = "verl"


def _refuse_overwrite(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise RlsimError(f"{out} already exists; pass --force to overwrite it")


def _fmt(v: object, metric: str = "") -> str:
    if v is None:
        return "-"
    if metric in ("clip_ratio",):
        return f"{100 * v:.2f}%"
    if metric in ("within_prompt_cv", "cross_epoch_spearman"):
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
    from rlsim.stats import trace_stats

    stats = trace_stats(trace)
    meta = trace.meta
    console.print(
        f"[bold]{path}[/]  model={meta.model}  source={meta.source}  "
        f"max_response_len={meta.max_response_len:,}  samples_per_prompt={meta.samples_per_prompt}"
        + (f"  output_token_ids={meta.output_token_ids}" if meta.output_token_ids else "")
    )
    console.print(_stats_table(stats, "Response length (tokens) per epoch"))


@trace_app.command()
def synth(
    out: Path = typer.Option(..., "--out", "-o", help="Output Parquet trace."),
    preset: PresetName = typer.Option(PresetName.dapo_qwen25_32b, help="Length model preset."),
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
        1.0, help="Multiply response lengths and the preset's cap (a small real run on a CPU keeps the shape)."
    ),
    seed: int = typer.Option(0, help="Random seed; same seed, same bytes."),
    token_ids: bool = typer.Option(False, "--token-ids", help="Add synthetic output_token_ids."),
    reuse_fraction: float = typer.Option(0.85, help="Token reuse from the previous visit."),
    vocab_size: int = typer.Option(151_643, help="Vocabulary of synthetic token ids."),
    model: str | None = typer.Option(None, help="Model name in the metadata."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Generate a seeded synthetic trace from a preset fitted to real data."""
    from rlsim.synth import SynthConfig, load_prompts, synthesize
    from rlsim.trace import save

    _refuse_overwrite(out, force)
    config = SynthConfig(
        preset=preset.value,
        num_prompts=num_prompts,
        samples_per_prompt=samples_per_prompt,
        epochs=epochs,
        prompts_per_step=prompts_per_step,
        max_response_len=max_response_len,
        rho=rho,
        prompt_share=prompt_share,
        start_step=start_step,
        clip_ratio=clip_ratio,
        length_scale=length_scale,
        seed=seed,
        token_ids=token_ids,
        reuse_fraction=reuse_fraction,
        vocab_size=vocab_size,
        model=model,
    )
    table = load_prompts(prompts) if prompts is not None else None
    console = make_console()
    with console.status("generating trace"):
        trace = synthesize(config, table)
        save(trace, out)
    _print_stats(trace, out, console)


@trace_app.command()
def inspect(
    path: Path = typer.Argument(..., help="Parquet trace."),
    plot: Path | None = typer.Option(None, help="Write the per-epoch length CDF to this PNG."),
    as_json: bool = typer.Option(False, "--json", help="Print statistics as JSON."),
) -> None:
    """Per-epoch length statistics: mean, p50/p90/p99, max, clip ratio, CV, Spearman."""
    from rlsim.stats import plot_length_cdf, trace_stats
    from rlsim.trace import load

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
    src: Path = typer.Argument(..., help="Directory of real rollout logs."),
    out: Path = typer.Option(..., "--out", "-o", help="Output Parquet trace."),
    fmt: ImportFormat = typer.Option(ImportFormat.auto, "--format", help="Log format."),
    tokenizer: Path | None = typer.Option(None, help="Local Hugging Face tokenizer (veRL dumps)."),
    max_response_len: int = typer.Option(20480, help="The run's response cap."),
    model: str = typer.Option("Qwen2.5-32B", help="Model name in the metadata."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Convert real logs (PolyTrace/verl packed lengths, veRL rollout_data_dir) into a trace."""
    from rlsim.importers import detect_format, import_polytrace, import_verl
    from rlsim.trace import save

    _refuse_overwrite(out, force)
    if not src.is_dir():
        raise RlsimError(f"{src} is not a directory of logs")
    kind = detect_format(src) if fmt is ImportFormat.auto else fmt.value
    if kind == "polytrace":
        trace = import_polytrace(src, max_response_len, model)
    else:
        trace = import_verl(src, tokenizer, max_response_len, model)
    save(trace, out)
    _print_stats(trace, out, make_console())


@trace_app.command()
def compare(
    a: Path = typer.Argument(..., help="Reference trace."),
    b: Path = typer.Argument(..., help="Trace to compare against the reference."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Length statistics of two traces side by side with relative differences (B vs A)."""
    from rlsim.stats import compare_stats, trace_stats
    from rlsim.trace import load

    rows = compare_stats(trace_stats(load(a)), trace_stats(load(b)))
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
