"""`rlsim simulate` and `rlsim compare`: policies on a trace and a simulated cluster."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlsim.errors import RlsimError
from rlsim.ui import console as make_console

# Options shared by `simulate` and `compare` (one definition, one help text).
TRACE = typer.Option(None, help="Parquet trace (default: the bundled traces/math17k.parquet).")
GPUS = typer.Option(64, help="Total GPUs.")
PROFILE = typer.Option("h100-qwen2.5-32b-tp2", help="Shipped profile name or JSON path.")
PLACEMENT = typer.Option("colocated", help="colocated or disaggregated.")
TRAIN_GPUS = typer.Option(0, help="Training GPUs (disaggregated only).")
DISPATCH = typer.Option("round_robin", help="round_robin or least_loaded.")
PROMPTS_PER_STEP = typer.Option(512, help="P0: prompts per step.")
SAMPLES_PER_PROMPT = typer.Option(16, help="R0: samples per prompt (GRPO group).")
MAX_RESPONSE_LEN = typer.Option(20480, help="Response cap in tokens.")
EPOCHS = typer.Option(2, help="Epochs over the trace's prompts.")
MAX_STEPS = typer.Option(None, help="Stop after this many steps.")
SEED = typer.Option(0, help="Seed of the data order.")


def _configs(opts: dict):  # noqa: ANN202
    """ClusterConfig and RLConfig from a command's shared options (its locals())."""
    from rlsim.config import ClusterConfig, RLConfig

    cluster = ClusterConfig(
        num_gpus=opts["gpus"],
        profile=opts["profile"],
        placement=opts["placement"],
        train_gpus=opts["train_gpus"],
        dispatch=opts["dispatch"],
    )
    rl = RLConfig(**{k: opts[k] for k in (
        "prompts_per_step", "samples_per_prompt", "max_response_len", "epochs", "max_steps", "seed"
    )})  # fmt: skip
    return cluster, rl


def _load(trace: Path | None):  # noqa: ANN202
    from rlsim.paths import default_trace
    from rlsim.trace import load

    return load(trace or default_trace(), columns=[])


def _check_len(trace, max_len: int) -> None:  # noqa: ANN001
    if max_len > trace.meta.max_response_len:
        raise RlsimError(
            f"max_response_len={max_len} exceeds the trace's cap {trace.meta.max_response_len}: "
            "the trace does not say how long responses would run past it"
        )


def _progress(total_steps: int, label: str):  # noqa: ANN202
    prog = Progress(
        TextColumn(label),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TimeElapsedColumn(),
        console=make_console(),
        transient=True,
    )
    task = prog.add_task(label, total=total_steps)
    return prog, lambda step, now: prog.update(task, completed=step)


def _expected_steps(trace, rl) -> int:  # noqa: ANN001
    per_epoch = math.ceil(trace.num_prompts / rl.prompts_per_step)
    n = per_epoch * rl.epochs
    return min(n, rl.max_steps) if rl.max_steps else n


def register(app: typer.Typer) -> None:
    """Add the simulation commands to the top-level app."""

    @app.command()
    def simulate(
        policy: str = typer.Option("sync", help="Registered policy name or module:Class."),
        trace: Path | None = TRACE,
        out: Path = typer.Option(Path("runs/sim"), "--out", "-o", help="Run directory to write."),
        gpus: int = GPUS,
        profile: str = PROFILE,
        placement: str = PLACEMENT,
        train_gpus: int = TRAIN_GPUS,
        dispatch: str = DISPATCH,
        prompts_per_step: int = PROMPTS_PER_STEP,
        samples_per_prompt: int = SAMPLES_PER_PROMPT,
        max_response_len: int = MAX_RESPONSE_LEN,
        epochs: int = EPOCHS,
        max_steps: int | None = MAX_STEPS,
        seed: int = SEED,
        exact: bool = typer.Option(False, "--exact", help="Iteration-by-iteration reference mode."),
        force: bool = typer.Option(False, "--force", help="Write into an existing run directory."),
    ) -> None:
        """Simulate one policy and write a run directory (tables, summary, timeline, trace.json)."""
        from rlsim.report import to_json, write_run_dir
        from rlsim.simulate import simulate as run

        if out.exists() and any(out.iterdir()) and not force:
            raise RlsimError(f"{out} already holds files; pass --force or choose another --out")
        cluster, rl = _configs(locals())
        tr = _load(trace)
        _check_len(tr, max_response_len)
        prog, cb = _progress(_expected_steps(tr, rl), f"simulating {policy}")
        with prog:
            result = run(tr, policy, cluster, rl, exact=exact, progress=cb)
        write_run_dir(result, out)
        con = make_console()
        con.print(to_json(result.summary))
        con.print(f"run directory: {out}")

    @app.command()
    def compare(
        policies: str = typer.Option("", help="Comma-separated policies (default: all registered)."),
        trace: Path | None = TRACE,
        gpus: int = GPUS,
        profile: str = PROFILE,
        placement: str = PLACEMENT,
        train_gpus: int = TRAIN_GPUS,
        dispatch: str = DISPATCH,
        prompts_per_step: int = PROMPTS_PER_STEP,
        samples_per_prompt: int = SAMPLES_PER_PROMPT,
        max_response_len: int = MAX_RESPONSE_LEN,
        epochs: int = EPOCHS,
        max_steps: int | None = MAX_STEPS,
        seed: int = SEED,
        as_json: bool = typer.Option(False, "--json", help="Print results as JSON."),
        plot: Path | None = typer.Option(None, help="Write a bar chart of epoch time per policy."),
    ) -> None:
        """Several policies on the same trace, cluster and work: epoch time, speedup, bubble..."""
        from policies.registry import REGISTRY
        from rlsim.report import plot_compare
        from rlsim.simulate import simulate as run

        names = [p.strip() for p in policies.split(",") if p.strip()] or list(REGISTRY)
        cluster, rl = _configs(locals())
        tr = _load(trace)
        _check_len(tr, max_response_len)
        rows = []
        for name in names:
            prog, cb = _progress(_expected_steps(tr, rl), f"simulating {name}")
            with prog:
                res = run(tr, name, cluster, rl, progress=cb)
            rows.append({"policy": name, **res.summary})
        base = next((r for r in rows if r["policy"] == "sync"), None)
        for r in rows:
            r["speedup_vs_sync"] = base["total_time_s"] / r["total_time_s"] if base else None
        if plot is not None:
            plot_compare(rows, plot)
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
            return
        _print_compare(rows, tr, cluster, rl)
        if plot is not None:
            make_console().print(f"plot written to {plot}")


def _print_compare(rows, trace, cluster, rl) -> None:  # noqa: ANN001
    epochs = sorted({e for r in rows for e in r["epoch_time_s"]})
    title = (
        f"{trace.meta.source} | {cluster.num_gpus} GPUs, {cluster.profile}, {cluster.placement} | "
        f"P0={rl.prompts_per_step} R0={rl.samples_per_prompt} max_len={rl.max_response_len}"
    )
    table = Table(title=title, title_justify="left")
    cols = [
        "policy",
        *[f"epoch {e} (h)" for e in epochs],
        "speedup",
        "rollout share",
        "bubble",
        "wasted tok",
        "staleness",
        "length bias",
    ]
    for c in cols:
        table.add_column(c, justify="left" if c == "policy" else "right")
    for r in rows:
        sp = "-" if r["speedup_vs_sync"] is None else f"{r['speedup_vs_sync']:.2f}x"
        table.add_row(
            r["policy"],
            *[f"{r['epoch_time_s'].get(e, float('nan')) / 3600:.2f}" for e in epochs],
            sp,
            f"{r['rollout_share']:.0%}",
            f"{r['bubble_ratio']:.0%}",
            f"{r['wasted_tokens']:,.0f}",
            f"{r['staleness_max']:.0f}/{r['staleness_mean']:.2f}",
            f"{r['trained_length_bias']:.3f}",
        )
    table.caption = (
        "speedup: total time of sync / this policy; rollout share: gen time / step time; bubble: idle "
        "instance-time / (instances x gen time); wasted tok: tokens generated for samples never trained; "
        "staleness: max/mean policy versions between launch and training; length bias: mean trained "
        "length / mean length of the same prompts' samples"
    )
    make_console().print(table)
