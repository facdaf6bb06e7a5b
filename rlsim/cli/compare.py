"""`rlsim compare`: every policy on the same trace, cluster and work, side by side (with seeds as error bars)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlsim.cli import options
from rlsim.cli.engine_options import engine_options
from rlsim.cli.from_config import FROM, single
from rlsim.cli.options import claim_output, load_trace, say_if_compiling, say_which_rules
from rlsim.cli.run_options import ProfileOptions, RunOptions, from_options, profile_options, run_options, simulated_run
from rlsim.cli.ui import console as make_console
from rlsim.cli.ui import shown_profile
from rlsim.config import EngineConfig
from rlsim.errors import RlsimError
from rlsim.text import counted


def engine_policies(names: list[str], rollout_engine: str) -> list[str]:
    """The policies a comparison runs under this engine's rules: speculative decoding (HistoSpec,
    Seer's grouped drafts) is modelled under vLLM's only, so under SGLang's its policies are left
    out, said in one line."""
    from policies.registry import parse_policy
    from rlsim.rollout_engines import REGISTRY

    if REGISTRY[rollout_engine].speculates:
        return names

    kept = [n for n in names if parse_policy(n).histospec is None]
    if len(kept) < len(names):
        left = ", ".join(n for n in names if n not in kept)
        make_console(sys.stderr).print(
            f"left out under {REGISTRY[rollout_engine].label}'s rules (speculative decoding is modelled under "
            f"{' and '.join(e.label for e in REGISTRY.values() if e.speculates)}'s only): {left}",
            highlight=False,
        )
    if not kept:
        raise RlsimError("every policy asked for speculates (HistoSpec): run them with --rollout-engine vllm")
    return kept


def register_compare(app: typer.Typer) -> None:
    """Add `rlsim compare` to the top-level app."""

    @app.command()
    @engine_options(exclude=("rollout_engine",))
    @run_options()
    @profile_options()
    def compare(
        ctx: typer.Context,
        engine: EngineConfig,
        run: RunOptions,
        prof: ProfileOptions,
        rollout_engine: str = typer.Option(
            "vllm",
            help="Whose scheduling rules: vllm, sglang, or both ('vllm,sglang': every policy under each, "
            "side by side, each speedup against sync under the same engine).",
        ),
        policies: str = typer.Option(
            "", help="Comma-separated policy strings, e.g. 'sync,rollpacker(eta_p=1.5)+histospec' (default: all)."
        ),
        trace: Path | None = options.TRACE,
        workers: int = typer.Option(0, min=0, help="Processes to simulate policies in parallel (0: one per core)."),
        seeds: int = typer.Option(
            1,
            min=1,
            help="Data-order seeds (--seed, --seed + 1, ...): every time with its spread, and a rank that "
            "changes between seeds marked as a tie.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print results as JSON."),
        markdown: bool = typer.Option(False, "--markdown", help="Print the table as Markdown."),
        plot: Path | None = typer.Option(None, help="Write a bar chart of epoch time per policy."),
        from_: list[str] | None = FROM,  # one value (`single`)
    ) -> None:
        """Every policy on the same trace, cluster and work: epoch time, speedup, bubble, waste..."""
        from policies.registry import COMPARE_DEFAULT, split_policies
        from rlsim.paths import check_plot_file
        from rlsim.report import plot_compare

        from_ = single(from_)
        if plot is not None:
            check_plot_file(plot)  # before minutes of simulation, not after
            claim_output(ctx, plot, "--plot")
        names = split_policies(policies) or list(COMPARE_DEFAULT)
        tr = load_trace(trace, names)
        run, profile, engine, setup = from_options(ctx, from_, run, prof, engine, extra=("rollout_engine",))
        if setup is not None:  # the config's engine; the policies as asked
            rollout_engine = engine.rollout_engine
        sim = simulated_run(run, profile, engine, tr, setup)
        engines = engine.per_rollout_engine(rollout_engine)
        say_which_rules(profile, [e.rollout_engine for e in engines])
        say_if_compiling()
        rows = _simulate_all(tr, names, sim, engines, workers, seeds)
        if plot is not None:
            plot_compare(rows, plot)
        _report(rows, tr, sim, as_json, markdown)
        if plot is not None and not (as_json or markdown):
            make_console().print(f"plot written to {plot}")


def _progress() -> tuple[Progress, Callable[[str], None], Callable[[int], None]]:
    """The bar over the policies, and (`done(name)`, `start(total)`); off a terminal the bar draws
    nothing: a line per policy on stderr instead, as each ends, so that a log shows progress (none
    before the first ends: a refusal stays the one line on stderr)."""
    prog = Progress(
        TextColumn("simulating policies"), BarColumn(), TextColumn("{task.completed}/{task.total} done"),
        TextColumn("{task.description}"), TimeElapsedColumn(), console=make_console(), transient=True,
    )  # fmt: skip
    lines = None if prog.console.is_terminal else make_console(sys.stderr)
    t0, finished, task, total = time.perf_counter(), [0], [None], [0]

    def start(n: int) -> None:
        # the first result waits for the simulator to load (and its core to compile, said above, on a first run)
        total[0], task[0] = n, prog.add_task("(loading the simulator)", total=n)

    def done(name: str) -> None:
        finished[0] += 1
        prog.update(task[0], advance=1, description=f"(last: {name})")
        if lines is not None:
            first = ", the first run loading the simulator too" if finished[0] == 1 else ""
            lines.print(f"{name}: simulated ({finished[0]}/{total[0]}, {time.perf_counter() - t0:.1f} s{first})",
                        highlight=False)  # fmt: skip

    return prog, done, start


def _simulate_all(tr, names: list[str], sim, engines: list[EngineConfig], workers: int, seeds: int) -> list[dict]:  # noqa: ANN001
    """Every policy under every engine asked (with `seeds` data orders), each row with its bands."""
    from rlsim.bands import for_prediction
    from rlsim.profile import load_profile
    from rlsim.sim.compare import compare as run_all
    from rlsim.sim.compare import compare_seeds
    from rlsim.sim.simulate import check_setup

    prof = load_profile(sim.profile)  # the bands' kind: its basis, model class and GPU
    for eng in engines:  # a setup no policy could run: refused before the first run, not in it
        check_setup(tr, sim.cluster, sim.rl, prof, eng)
    per_engine = {e.rollout_engine: engine_policies(names, e.rollout_engine) for e in engines}
    prog, done, start = _progress()
    start(sum(map(len, per_engine.values())) * seeds)
    rows = []
    with prog:
        for eng in engines:
            these, kw = per_engine[eng.rollout_engine], {"on_done": done, "engine_cfg": eng, "tools": sim.tools}
            if seeds > 1:
                got = compare_seeds(tr, these, sim.cluster, sim.rl, seeds, workers or None, **kw)
            else:
                got = run_all(tr, these, sim.cluster, sim.rl, workers or None, **kw)
            bands = for_prediction(prof, eng.rollout_engine, sim.framework)
            for r in got:
                if len(engines) > 1:  # (one engine's rows stay as they were)
                    r["rollout_engine"] = eng.rollout_engine
                r |= bands
            rows += got
    return rows


def _report(rows: list[dict], tr, sim, as_json: bool, markdown: bool) -> None:  # noqa: ANN001
    """The comparison as JSON, as Markdown, or as the terminal table with its bands."""
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if markdown:
        cols, cells = _cells(rows)
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        typer.echo("\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells]))
        typer.echo("\n" + "\n\n".join(_band_lines(rows)))
        return
    _print_compare(rows, tr, sim.cluster, sim.rl)
    for line in _band_lines(rows):
        make_console().print(line)


def _band_lines(rows) -> list[str]:  # noqa: ANN001
    """The error band of the epoch times and the ratio band of the speedups, once per engine."""
    from rlsim.bands import band_text, ratio_text

    out = []
    for r in {r.get("rollout_engine", ""): r for r in rows}.values():
        out += [f"epoch times: {band_text(r['error_band'])}", f"speedups: {ratio_text(r['ratio_band'])}"]
    return out


def _compact(n: int) -> str:
    """160, 62.7k, 1.2M: a count in a few characters, for a table that must fit a terminal."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def _cells(rows) -> tuple[list[str], list[list[str]]]:  # noqa: ANN001
    """The comparison's column names and cells, for the terminal table and for --markdown."""
    from rlsim.rollout_engines import rollout_engine

    epochs = sorted({e for r in rows for e in r["epoch_time_s"]})
    engines = any("rollout_engine" in r for r in rows)  # --rollout-engine vllm,sglang
    cols = [
        "policy",
        *(["engine"] if engines else []),
        *[f"epoch {e} (h)" for e in epochs],
        "speedup",
        "rollout",
        "bubble",
        "preempted",
        "wasted tok",
        "staleness",
        "length bias",
        "order bias",
    ]
    spread = "total_time_s_range" in rows[0]  # --seeds N: mean ± half the min-max spread, and the rank
    reused = any(r.get("reused_samples") for r in rows)
    if reused:  # a policy launching more samples per prompt than the trace holds (RollPacker, async_partial)
        cols.append("reused")
    turns = all(r.get("multi_turn") for r in rows)  # a multi-turn trace: tool waits and prefix reuse
    if turns:
        cols += ["tool wait", "idle in tools", "turn hits"]
    cells = []

    def pm(mean: float, lo_hi: tuple[float, float] | None, scale: float = 1.0) -> str:
        return f"{mean / scale:.2f}" + (f"±{(lo_hi[1] - lo_hi[0]) / 2 / scale:.2f}" if lo_hi else "")

    for r in rows:
        sp = "-" if r["speedup_vs_sync"] is None else pm(r["speedup_vs_sync"], r.get("speedup_vs_sync_range")) + "x"
        ranges = r.get("epoch_time_s_range", {})
        name = "oracle (lower bound)" if r["policy"] == "oracle" else r["policy"]
        if spread:
            ranks = r["rank_by_seed"]
            name += f" #{min(ranks)}-{max(ranks)} tie" if r["tie"] else f" #{ranks[0]}"
        cells.append([
            name,
            *([rollout_engine(r["rollout_engine"]).label] if engines else []),
            *[pm(r["epoch_time_s"].get(e, float("nan")), ranges.get(e), 3600) for e in epochs],
            sp,
            f"{r['rollout_share']:.0%}",
            f"{round(r['bubble_ratio'], 9) + 0.0:.0%}",  # a rounding -3e-17 prints 0%, not -0%
            f"{r['preemptions']:,}",
            _compact(round(r["wasted_tokens"])),
            f"{r['staleness_max']:.0f}/{r['staleness_mean']:.2f}",
            f"{r['trained_length_bias']:.2f}",
            "{:.2f}-{:.2f}".format(*r["length_order_bias_range"]),
            *([_compact(r.get("reused_samples") or 0)] if reused else []),
            *([f"{r['multi_turn']['tool_wait_share']:.1%}", f"{r['multi_turn']['gpu_idle_during_tools_ratio']:.1%}",
               f"{r['multi_turn']['turn_prefix_hit_rate']:.0%}"] if turns else []),
        ])  # fmt: skip
    return cols, cells


def _print_compare(rows, trace, cluster, rl) -> None:  # noqa: ANN001
    title = (
        f"{trace.meta.source} | {counted(cluster.num_gpus, 'GPU')}, {shown_profile(cluster.profile)}, "
        f"{cluster.placement} | "
        f"P0={rl.prompts_per_step} R0={rl.samples_per_prompt} max_len={rl.max_response_len}"
    )
    table = Table(title=title, title_justify="left")
    cols, cells = _cells(rows)
    spread, reused = "total_time_s_range" in rows[0], "reused" in cols
    for i, c in enumerate(cols):  # two-line headers, so that the values fit a 140-column terminal uncut
        table.add_column(c.replace(" ", "\n", 1) if i else c, justify="left" if i == 0 else "right", no_wrap=True)
    for row in cells:
        table.add_row(*row)
    table.caption = (
        "speedup: total time of sync / this policy; rollout: gen time / step time; bubble: idle "
        "instance-time / (instances x gen time); preempted: requests preempted for KV (recomputed); "
        "wasted tok: tokens generated for samples never trained; "
        "staleness: max/mean policy versions between launch and training; length bias: mean trained "
        "length / mean length of the same prompts' samples; order bias: step mean trained "
        "length / epoch mean, min-max over steps"
    )
    if spread:
        table.caption += (
            f"; over {len(rows[0]['seeds'])} data-order seeds {rows[0]['seeds']}: times and speedup are the mean "
            "± half the min-max spread, other columns the first seed's; #: rank by total time, a 'tie' where it "
            "changes between seeds (the order is noise, not a result)"
        )
    if any(r["policy"] == "oracle" for r in rows):  # the notes of the rows shown, no others
        table.caption += (
            "; oracle: knows every length in advance, a lower bound for synchronous steps, not a real system"
        )
    if "turn hits" in cols:
        table.caption += (
            "; tool wait: share of trajectory time waiting on tool calls; idle in tools: instance time running "
            "nothing while one of its trajectories waits on a tool, over all instance time; turn hits: prefix-cache "
            "hit share of later turns' contexts"
        )
    if reused:
        table.caption += (
            f"; reused: samples launched past the trace's {trace.meta.samples_per_prompt} per prompt, which "
            "replay the trace's samples again (their lengths are not new draws)"
        )
    make_console().print(table)
