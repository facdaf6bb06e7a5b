"""`rlsim policies` and `rlsim simulate`: the registered policies, and one policy on a trace and a simulated cluster."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from rlsim.cli import options
from rlsim.cli.engine_options import engine_options
from rlsim.cli.from_config import FROM, given_on_command_line, single
from rlsim.cli.options import claim_output, expected_steps, load_trace, say_if_compiling, say_which_rules, step_progress
from rlsim.cli.run_options import (
    ProfileOptions,
    RunOptions,
    SimulatedRun,
    from_options,
    profile_options,
    run_options,
    simulated_run,
)
from rlsim.cli.ui import console as make_console
from rlsim.cli.ui import shown_profile
from rlsim.config import EngineConfig
from rlsim.errors import RlsimError
from rlsim.text import counted


def register(app: typer.Typer) -> None:
    """Add the simulation commands to the top-level app."""

    @app.command("policies")
    def policies_() -> None:
        """Every registered policy and engine feature: its knobs with defaults, and its paper."""
        from policies.registry import describe

        table = Table(title="Policies (rlsim simulate --policy 'NAME(knob=value,...)+FEATURE')", title_justify="left")
        for col in ("name", "knobs (defaults)", "what and where from"):
            table.add_column(col, overflow="fold")
        for row in describe():
            table.add_row(*row)
        table.caption = (
            "your own policy: module:Class, a class with on_step_start and on_event or on_events (rlsim/protocol.py)"
        )
        make_console().print(table)

    @app.command()
    @engine_options()
    @run_options()
    @profile_options()
    def simulate(
        ctx: typer.Context,
        engine: EngineConfig,
        run: RunOptions,
        prof: ProfileOptions,
        policy: str = typer.Option(
            "sync", help="Policy string: NAME[(knob=value,...)][+histospec], or module:Class (see `rlsim policies`)."
        ),
        trace: Path | None = options.TRACE,
        out: Path = typer.Option(Path("runs/sim"), "--out", "-o", help="Run directory to write."),
        exact: bool = typer.Option(False, "--exact", help="Iteration-by-iteration reference mode."),
        force: bool = typer.Option(False, "--force", help="Write into an existing run directory."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON instead of a table."),
        from_: list[str] | None = FROM,  # one value (`single`)
    ) -> None:
        """Simulate one policy and write a run directory (tables, summary, timeline, trace.json); with --from,
        the run a framework's config describes, in its own mode unless --policy is given."""
        from rlsim.paths import check_output_dir
        from rlsim.report import write_run_dir
        from rlsim.sim.simulate import simulate as simulate_run

        from_ = single(from_)
        check_output_dir(out, "--out")
        claim_output(ctx, out, "--out")  # before the check below: two runs started together never both pass it
        if out.exists() and any(out.iterdir()) and not force:
            raise RlsimError(f"{out} already holds files; pass --force or choose another --out")
        run, profile, engine, setup = from_options(ctx, from_, run, prof, engine)
        if setup is not None and "policy" not in given_on_command_line(ctx):
            policy = setup.policy  # the config's own mode
        tr = load_trace(trace, [policy])
        sim = simulated_run(run, profile, engine, tr, setup)
        say_which_rules(profile, [engine.rollout_engine])
        say_if_compiling()
        prog, cb = step_progress(expected_steps(tr, sim.rl), f"simulating {policy}")
        with prog:
            result = simulate_run(tr, policy, sim.cluster, sim.rl, exact=exact, progress=cb, engine_cfg=sim.engine,
                                  tools=sim.tools)  # fmt: skip
        _with_band(result.summary, sim)
        write_run_dir(result, out)
        _report(result.summary, policy, sim.cluster, out, as_json)


def _with_band(summary: dict, sim: SimulatedRun) -> None:
    """The error band of the prediction's kind, in its summary."""
    from rlsim.bands import for_prediction
    from rlsim.profile import load_profile

    bands = for_prediction(load_profile(sim.profile), sim.engine.rollout_engine, sim.framework)
    summary["error_band"] = bands["error_band"]


def _report(summary: dict, policy: str, cluster, out: Path, as_json: bool) -> None:  # noqa: ANN001
    """The run's summary: JSON, or the table with its error band and where the run directory is."""
    from rlsim.bands import band_text
    from rlsim.report import to_json

    if as_json:
        typer.echo(to_json(summary))
        return
    where = f"{counted(cluster.num_gpus, 'GPU')}, {shown_profile(cluster.profile)}, {cluster.placement}"
    _print_summary(summary, f"{policy} | {where}")
    make_console().print(f"step and epoch times: {band_text(summary['error_band'])}")
    make_console().print(f"run directory: {out} (summary.json holds every figure at full precision)")


def _print_summary(s: dict, title: str) -> None:
    """One simulated run's figures, rounded and with units (the run directory keeps them exact)."""

    def pct(key: str) -> str:
        return "-" if s.get(key) is None else f"{s[key]:.1%}"

    rows = [(f"epoch {e} time", f"{t / 3600:.2f} h") for e, t in s["epoch_time_s"].items()]
    rows += [
        ("total time", f"{s['total_time_s'] / 3600:.2f} h over {counted(s['num_steps'], 'step')}"),
        ("GPU-hours", f"{s['gpu_hours']:,.1f}"),
        ("rollout share of the step", pct("rollout_share")),
        ("bubble (idle instance-time in rollout)", pct("bubble_ratio")),
        ("batch-slot bubble (vs max_num_seqs)", pct("slot_bubble_ratio")),
        ("first-done idle", pct("first_done_idle_ratio")),
        ("rollout tokens/s (trained)", f"{s['rollout_tokens_per_s']:,.0f}"),
        ("requests / trained samples", f"{s['num_requests']:,} / {s['trained_samples']:,}"),
        ("preemptions (KV)", f"{s['preemptions']:,}"),
        ("wasted tokens", f"{s['wasted_tokens']:,.0f}"),
        ("staleness max / mean", f"{s['staleness_max']:.0f} / {s['staleness_mean']:.2f}"),
        ("trained length bias", f"{s['trained_length_bias']:.2f}"),
        ("order bias (min-max over steps)", "{:.2f}-{:.2f}".format(*s["length_order_bias_range"])),
        ("prefix-cache hit tokens", f"{s['prefix_hit_tokens']:,}"),
        ("wake re-prefill tokens", f"{s['wake_reprefill_tokens']:,}"),
        ("simulation wall time", f"{s['sim_wall_s']:.2f} s"),
    ]
    turns = s.get("multi_turn")
    if turns:
        rows += [
            ("turns per trajectory", f"{turns['turns_per_trajectory']:.2f} ({turns['tool_calls']:,} tool calls)"),
            ("tool wait share of trajectory time", f"{turns['tool_wait_share']:.1%}"),
            ("GPU idle during tool calls", f"{turns['gpu_idle_during_tools_ratio']:.1%} of instance-time"),
            ("later turns' prefix hit rate", f"{turns['turn_prefix_hit_rate']:.1%}"),
            ("tokens prefilled again", f"{turns['reprefilled_tokens']:,}"),
        ]
    if s.get("reused_samples"):
        rows.append(("reused samples (past the trace's)", f"{s['reused_samples']:,}"))
    if s.get("engine_aborts"):  # SGLang's own aborts: prompts its KV pool cannot hold
        said = ", ".join(f"{n:,} {why.replace('_', ' ')}" for why, n in s["engine_aborts"].items())
        rows.append(("aborted by the engine, which went on", said))
    table = Table(title=title, title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for row in rows:
        table.add_row(*row)
    make_console().print(table)
