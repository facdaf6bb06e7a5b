"""`rlsim sweep` and `rlsim plan`: many simulations for capacity questions."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlsim.cli.engine_options import config_options, engine_options, field_option
from rlsim.cli.from_config import FROM, once, single
from rlsim.cli.options import claim_output, say_if_compiling, say_which_rules
from rlsim.cli.plan_options import ExecutorOptions, SearchOptions, plan_request
from rlsim.cli.run_options import ProfileOptions, RunOptions
from rlsim.cli.ui import console as make_console
from rlsim.cli.ui import shown_profile
from rlsim.config import EngineConfig
from rlsim.errors import RlsimError
from rlsim.plan.config import PlanConfig
from rlsim.plan.space import SEARCHED_ENGINE_FIELDS


def _bar(label: str, total: int) -> tuple[Progress, int]:
    prog = Progress(
        TextColumn(label), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
        console=make_console(), transient=True,
    )  # fmt: skip
    return prog, prog.add_task(label, total=total)


def _emit_target(ctx: typer.Context, emit: str | None, force: bool) -> tuple[str, Path] | None:
    """`--emit FRAMEWORK:PATH`, checked and claimed before the search: an existing file is overwritten
    only with `force`."""
    from rlsim.frameworks.registry import split
    from rlsim.paths import check_output_file

    if emit is None:
        return None
    framework, path = split(emit, "--emit", "PATH")
    check_output_file(path, "--emit")
    claim_output(ctx, path, "--emit")
    if Path(path).exists() and not force:
        raise RlsimError(f"--emit {path} already exists; pass --force to overwrite it")
    return framework, path


def _emit_best(res: dict, target: tuple[str, Path], rl, model_path: str | None) -> None:  # noqa: ANN001 - RLConfig
    """Write the plan's best configuration as the framework's config (`rlsim.frameworks.emit`), the
    model as `model_path` names it (else its Hugging Face id)."""
    from rlsim.errors import RlsimError
    from rlsim.files import atomic_write_text
    from rlsim.frameworks.emit import candidate_setup
    from rlsim.frameworks.emit import emit as write
    from rlsim.plan.space import Candidate
    from rlsim.profile import load_profile

    best = res.get("best")
    if best is None:
        raise RlsimError("--emit: the plan has no best configuration to write")
    fields = Candidate.__dataclass_fields__
    cand = Candidate(**{k: v for k, v in best.items() if k in fields})
    setup = candidate_setup(cand.policy, cand.num_gpus, cand.placement, cand.train_gpus, load_profile(cand.profile),
                            cand.engine_config(), rl.prompts_per_step, rl.samples_per_prompt, cand.max_response_len,
                            rl.use_kl_loss, model_path, rl.max_model_len)  # fmt: skip
    framework, path = target
    atomic_write_text(path, write(framework, setup))
    import sys

    make_console(sys.stderr).print(
        f"{framework} config of the best configuration ({cand.policy} on {cand.label()}): {path}", highlight=False
    )


def register(app: typer.Typer) -> None:
    """Add the planning commands to the top-level app."""

    @app.command()
    @config_options(ExecutorOptions, "where")
    def sweep(
        ctx: typer.Context,
        where: ExecutorOptions,
        grid: Path = typer.Argument(..., help="Grid file (YAML): fixed fields and lists to take the product of."),
        out: Path = typer.Option(Path("sweep.parquet"), "--out", "-o", help="Result Parquet (one row per point)."),
        force: bool = typer.Option(
            False, "--force", help="Add this grid's rows to an --out that holds another grid's (kept as they are)."
        ),
    ) -> None:
        """Simulate every point of a grid; rows are saved as points finish, and a rerun resumes."""
        from rlsim.paths import check_output_file
        from rlsim.plan.grid import load_grid
        from rlsim.plan.sweep import check_caps, existing_rows, run_sweep

        check_output_file(out, "--out")
        claim_output(ctx, out, "--out")
        g = load_grid(grid)
        check_caps(g)
        done = len(existing_rows(g, out, keep_other_grids=force)[0])  # refuses another grid's rows before a pool starts
        say_if_compiling()
        pool = where.pool()
        prog, task = _bar(f"sweep ({where.executor})", len(g.points))
        prog.update(task, completed=done)
        t0, finished = time.perf_counter(), [done]

        def tick(_row: dict) -> None:
            finished[0] += 1
            prog.update(task, advance=1)

        try:
            with prog:
                rows = run_sweep(g, out, pool, on_done=tick, keep_other_grids=force)
        except KeyboardInterrupt:  # the pool's pending points are cancelled below
            typer.echo(
                f"interrupted: {finished[0]} of {len(g.points)} points saved in {out}; run the same command to resume",
                err=True,
            )
            raise typer.Exit(130) from None
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        dt, new = time.perf_counter() - t0, len(g.points) - done
        rate = f", {new / dt:.1f} points/s" if new and dt > 0 else ""
        make_console().print(f"{len(rows)} points in {out} ({new} simulated in {dt:.1f} s{rate})")

    @app.command()
    @engine_options(exclude=(*SEARCHED_ENGINE_FIELDS, "rollout_engine"))  # searched: lists of values (`search`)
    @config_options(PlanConfig, "cfg")
    @config_options(ProfileOptions, "prof", exclude=("tp", "ep", "pp", "dp"))  # (plan searches TP: `search.tp`)
    @config_options(SearchOptions, "search")
    @config_options(ExecutorOptions, "where")
    def plan(
        ctx: typer.Context,
        engine: EngineConfig,
        cfg: PlanConfig,
        prof: ProfileOptions,
        search: SearchOptions,
        where: ExecutorOptions,
        trace: Path | None = typer.Option(None, help="Parquet trace (default: the bundled math17k)."),
        max_model_len: int | None = field_option(RunOptions, "max_model_len"),
        cache: Path | None = typer.Option(None, help="Estimate cache (JSON lines; default ~/.cache/rlsim/plan.jsonl)."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the cache."),
        plot: Path | None = typer.Option(None, help="Write the candidates, Pareto front and finalists (PNG)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        emit: list[str] | None = typer.Option(  # one value (`single`)
            None,
            "--emit",
            help="Write the best configuration as a framework's config, FRAMEWORK:PATH: verl:PATH (a "
            "launch's overrides) or nemo-rl:PATH (a recipe over NeMo RL's grpo_math_1B.yaml).",
            callback=once("--emit"),
        ),
        force: bool = typer.Option(False, "--force", help="Overwrite an existing --emit file."),
        from_: list[str] | None = FROM,  # one value (`single`)
    ) -> None:
        """Search GPUs, placement, rollout TP, engine knobs and response cap per policy; the best
        configuration per policy with error bars over seeds, and the Pareto front."""
        from rlsim.paths import check_plot_file, default_trace
        from rlsim.plan.report import plot_plan
        from rlsim.plan.space import candidates
        from rlsim.trace.format import load

        from_, emit = single(from_), single(emit)
        if plot is not None:
            check_plot_file(plot)  # before minutes of simulation, not after
        emit_to = _emit_target(ctx, emit, force)
        cache_path = _cache_path(cache, no_cache)
        req = plan_request(ctx, from_, search, prof, engine, max_model_len)
        path = trace or default_trace()
        load(path, columns=[])  # a bad trace fails here, in one sentence, before a pool starts
        candidates(req.space, req.profile, cfg.gpu_budget, req.engine)  # and a bad search space
        say_which_rules(req.profile, list(req.space.rollout_engines))
        res, wall = _search(path, req, cfg, where, cache_path, from_)
        if plot is not None:
            plot_plan(res, plot)
        if not as_json:
            _print_plan(res, req.profile, cfg, cache_path, wall, plot)
        else:
            typer.echo(json.dumps(res, indent=2, default=str))
        if emit_to is not None:  # last: a configuration the framework cannot run is refused after the answer
            _emit_best(res, emit_to, req.rl, req.emit_model)


def _cache_path(cache: Path | None, no_cache: bool) -> Path | None:
    """The estimate cache a plan reads and writes (None: `--no-cache`), checked writable."""
    from rlsim.paths import check_output_file
    from rlsim.plan.cache import default_cache_path

    cache_path = None if no_cache else (cache or default_cache_path())
    if cache_path is not None and (cache_path.is_dir() or cache_path.parent.exists()):
        check_output_file(cache_path, "--cache")  # a missing cache directory is created
    return cache_path


def _search(path: Path, req, cfg, where: ExecutorOptions, cache_path: Path | None, from_: str | None):  # noqa: ANN001, ANN202
    """The plan (`rlsim.plan.planner.plan`) on a pool, under a progress bar; (its result, its seconds)."""
    from rlsim.plan.cache import PlanCache
    from rlsim.plan.planner import plan as run_plan

    prog, task = _bar("planning", 0)
    total, done = [0], [0]

    def start(n: int) -> None:
        total[0] = n
        prog.update(task, total=n)

    def tick() -> None:  # the front's early points may add a few estimates past the plan
        done[0] += 1
        prog.update(task, completed=done[0], total=max(total[0], done[0]))

    pool = where.pool()
    t0 = time.perf_counter()
    try:
        with prog:
            res = run_plan(
                path, req.space, req.profile, req.rl, cfg, pool, PlanCache(cache_path), on_done=lambda _: tick(),
                engine=req.engine, on_start=start, framework=from_.partition(":")[0] if from_ else None,
            )  # fmt: skip
    finally:
        pool.shutdown(cancel_futures=True)
    return res, time.perf_counter() - t0


def _print_plan(res: dict, profile: str, cfg, cache_path: Path | None, wall: float, plot: Path | None) -> None:  # noqa: ANN001
    """The plan's answer per policy, its bands, its Pareto front and what it cost."""
    from rlsim.plan.report import answer_rows, band_lines, objective_text, pareto_rows

    con = make_console()
    table = Table(title=f"Plan: {objective_text(res)} ({shown_profile(profile)} family)")
    for col in ("policy", "configuration", "cap", "clipped", "epoch (h)", "GPU-h / epoch", "rank", "meets"):
        table.add_column(col, justify="left" if col in ("policy", "configuration") else "right")
    for row in answer_rows(res):
        table.add_row(*row)
    best = res["best"]
    tie = best is not None and best["tie"]
    table.caption = (
        f"best: {best['policy']} on {best['label']}"
        + (" (a tie: the next is within the ratio band or the seeds' spread)" if tie else "")
        if best
        else "no finalist meets the target under every seed"
        if cfg.target_epoch_hours is not None
        else "no policy has an answer"
    ) + (
        f"; finalists over seeds {res['seeds'][0]}-{res['seeds'][-1]} (mean ± half the spread); "
        f"{res['num_candidates']} candidates, rounds of {'/'.join(map(str, res['rungs']))} steps"
    )
    con.print(table)
    for line in band_lines(res):
        con.print(line)
    if res["no_answer"]:
        con.print(f"no runnable candidate: {', '.join(res['no_answer'])}")
    front = Table(title="Pareto front: epoch time against GPU-hours (each at its last round's steps)")
    for col in ("policy", "configuration", "cap", "epoch (h)", "GPU-h / epoch", "steps"):
        front.add_column(col, justify="left" if col in ("policy", "configuration") else "right")
    for row in pareto_rows(res):
        front.add_row(*row)
    con.print(front)
    if len(res["tp_profiles"]) > 1:
        used = ", ".join(f"TP {t}: {shown_profile(name)}" for t, name in sorted(res["tp_profiles"].items()))
        con.print(f"rollout TP profiles: {used} (one family: the same model facts and iteration model)")
    con.print(
        f"{res['simulated']} simulations, {res['cache_hits']} from the cache"
        + (f" ({cache_path})" if cache_path else "")
        + f", {wall:.1f} s"
    )
    if plot is not None:
        con.print(f"plot: {plot}")
