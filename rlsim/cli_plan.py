"""`rlsim sweep` and `rlsim plan`: many simulations for capacity questions."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlsim.cli_sim import GPU_MEMORY_UTILIZATION, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, PROFILE
from rlsim.errors import RlsimError
from rlsim.ui import console as make_console


def _bar(label: str, total: int) -> tuple[Progress, int]:
    prog = Progress(
        TextColumn(label), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
        console=make_console(), transient=True,
    )  # fmt: skip
    return prog, prog.add_task(label, total=total)


def register(app: typer.Typer) -> None:
    """Add the planning commands to the top-level app."""

    @app.command()
    def sweep(
        grid: Path = typer.Argument(..., help="Grid file (YAML): fixed fields and lists to take the product of."),
        out: Path = typer.Option(Path("sweep.parquet"), "--out", "-o", help="Result Parquet (one row per point)."),
        executor: str = typer.Option("process", help="process (a local pool) or ray (a Ray cluster)."),
        workers: int = typer.Option(0, min=0, help="Worker processes (process) or CPUs (local ray); 0: one per core."),
        ray_address: str | None = typer.Option(None, help="Address of a running Ray cluster (ray executor)."),
        force: bool = typer.Option(
            False, "--force", help="Add this grid's rows to an --out that holds another grid's (kept as they are)."
        ),
    ) -> None:
        """Simulate every point of a grid; rows are saved as points finish, and a rerun resumes."""
        from rlsim.paths import check_output_file
        from rlsim.sweep import check_caps, existing_rows, load_grid, make_executor, run_sweep

        check_output_file(out, "--out")
        g = load_grid(grid)
        check_caps(g)
        done = len(existing_rows(g, out, keep_other_grids=force)[0])  # refuses another grid's rows before a pool starts
        pool = make_executor(executor, workers or None, ray_address)
        prog, task = _bar(f"sweep ({executor})", len(g.points))
        prog.update(task, completed=done)
        t0 = time.perf_counter()
        finished = [done]

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
        dt = time.perf_counter() - t0
        new = len(g.points) - done
        rate = f", {new / dt:.1f} points/s" if new and dt > 0 else ""
        make_console().print(f"{len(rows)} points in {out} ({new} simulated in {dt:.1f} s{rate})")

    @app.command()
    def plan(
        target_epoch_hours: float = typer.Option(..., help="Wall-clock hours one epoch may take."),
        trace: Path | None = typer.Option(None, help="Parquet trace (default: the bundled math17k)."),
        profile: str = PROFILE,
        gpu_memory_utilization: float | None = GPU_MEMORY_UTILIZATION,
        max_num_seqs: int | None = MAX_NUM_SEQS,
        max_num_batched_tokens: int | None = MAX_NUM_BATCHED_TOKENS,
        gpus: str = typer.Option("8..256", help="GPU range to search, e.g. 8..256."),
        policies: str = typer.Option("", help="Comma-separated policies (default: every registered one but oracle)."),
        prompts_per_step: int = typer.Option(512, help="P0: prompts per step."),
        samples_per_prompt: int = typer.Option(16, help="R0: samples per prompt."),
        max_response_len: int = typer.Option(20480, help="Response cap in tokens."),
        steps: int = typer.Option(6, help="Steps simulated per candidate (0: the whole epoch)."),
        workers: int = typer.Option(0, min=0, help="Processes (0: one per core)."),
        plot: Path | None = typer.Option(None, help="Write epoch time against GPUs per policy (PNG)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        """For each policy, the fewest GPUs meeting an epoch-time target, and the best policy."""
        import os
        from concurrent.futures import ProcessPoolExecutor

        from policies.registry import REGISTRY
        from rlsim.cli_sim import _check_len, _split_policies
        from rlsim.config import EngineConfig, RLConfig
        from rlsim.paths import check_output_file, default_trace
        from rlsim.plan import PlanConfig, candidates, parse_range, plot_plan
        from rlsim.plan import plan as run_plan
        from rlsim.profile import load_profile
        from rlsim.trace import load

        if plot is not None:
            check_output_file(plot, "--plot")  # before minutes of simulation, not after
        if not math.isfinite(target_epoch_hours) or target_epoch_hours <= 0:
            raise RlsimError(f"--target-epoch-hours must be a positive number, got {target_epoch_hours}")
        engine = EngineConfig(gpu_memory_utilization, max_num_seqs, max_num_batched_tokens)
        lo, hi = parse_range(gpus)
        cfg = PlanConfig(target_epoch_hours, lo, hi, steps)
        # HistoSpec variants are left out by default: a plan estimates an epoch from its first
        # steps, where no prompt has a previous visit to draft from yet.
        names = _split_policies(policies) or [p for p in REGISTRY if p != "oracle"]
        rl = RLConfig(prompts_per_step=prompts_per_step, samples_per_prompt=samples_per_prompt,
                      max_response_len=max_response_len, epochs=1)  # fmt: skip
        path = trace or default_trace()
        _check_len(load(path, columns=[]), max_response_len)  # a bad trace or cap fails here, in one sentence
        n = len(names) * len(candidates(lo, hi, load_profile(profile).tensor_parallel_size))
        prog, task = _bar("planning", n)
        pool = ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1)
        try:
            with prog:
                res = run_plan(
                    path, names, profile, rl, cfg, pool, on_done=lambda _: prog.update(task, advance=1), engine=engine
                )
        finally:
            pool.shutdown(cancel_futures=True)
        if plot is not None:
            plot_plan(res, plot)
        if as_json:
            typer.echo(json.dumps(res, indent=2))
            return
        table = Table(title=f"Fewest GPUs for a {target_epoch_hours:g} h epoch ({profile})")
        for col in ("policy", "GPUs", "epoch (h)", "GPU-hours / epoch"):
            table.add_column(col, justify="left" if col == "policy" else "right")
        for a in res["answers"]:
            if a["gpus"] is None:
                table.add_row(a["policy"], f"> {hi}", "-", "-")
            else:
                table.add_row(a["policy"], str(a["gpus"]), f"{a['epoch_hours']:.2f}", f"{a['gpu_hours']:,.0f}")
        best = res["best"]
        table.caption = (
            f"best: {best['policy']} on {best['gpus']} GPUs" if best else f"no policy meets the target within {gpus}"
        ) + f"; epoch time estimated from {steps or 'all'} simulated steps per candidate"
        con = make_console()
        con.print(table)
        if plot is not None:
            con.print(f"plot: {plot}")
