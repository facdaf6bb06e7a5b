"""`rlsim sweep` and `rlsim plan`: many simulations for capacity questions."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlsim.cli import derive as derive_opts
from rlsim.cli import options
from rlsim.cli.engine_options import engine_options
from rlsim.cli.from_config import FROM, once, single
from rlsim.cli.options import PROFILE, claim_output, say_if_compiling, say_which_rules
from rlsim.cli.ui import console as make_console
from rlsim.cli.ui import shown_profile
from rlsim.config import EngineConfig
from rlsim.errors import RlsimError
from rlsim.plan.space import SEARCHED_ENGINE_FIELDS


def _bar(label: str, total: int) -> tuple[Progress, int]:
    prog = Progress(
        TextColumn(label), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
        console=make_console(), transient=True,
    )  # fmt: skip
    return prog, prog.add_task(label, total=total)


# what `plan --from` takes from the config: the search axes (where the command line names none) and
# the settings it holds fixed (which the command line must then leave out)
FROM_AXES = ("gpus", "placement", "train_share", "tp", "max_num_seqs", "gpu_memory_utilization", "max_response_len",
             "policies", "rollout_engine")  # fmt: skip
FROM_FIXED = ("prompts_per_step", "samples_per_prompt", "trainer", "max_model_len")


def _gpu_of(opts: dict, given: set[str]) -> tuple[float, str]:
    """(memory in bytes, name) of the GPU a plan runs on: the user's --profile's, else --gpu's."""
    if "profile" in given:
        from rlsim.profile import load_profile

        prof = load_profile(opts["profile"])
        return float(prof.gpu_facts.get("memory_bytes", 0.0)), prof.hardware
    from rlsim.derive.gpus import load_gpu

    gpu = load_gpu(opts["gpu"])
    return gpu.memory_bytes, gpu.name


def _from_config(ctx: typer.Context, spec: str, opts: dict) -> dict:
    """`plan --from FRAMEWORK:CONFIG`: each search axis the command line does not name is the
    config's one value, and the settings the config states are held fixed (one sentence where the
    command line gives one of them too); the profiles are derived on --gpu (the model from the
    config or --model), or taken from --profile's family."""
    import dataclasses

    from rlsim.cli.from_config import given_on_command_line, model_of, read_from, refuse_clash
    from rlsim.errors import RlsimError

    setup = read_from(spec)
    given = given_on_command_line(ctx)
    stated = {k for k in setup.engine_keys if k in ctx.params and k not in FROM_AXES}  # the engine's, held fixed
    refuse_clash(given, set(FROM_FIXED) | stated | ({"dtype"} if setup.dtype else set()), spec)
    if max(setup.pp, setup.ep, setup.dp) > 1:
        raise RlsimError(
            f"--from {spec}: its rollout runs at PP {setup.pp}, EP {setup.ep}, DP {setup.dp}; plan searches TP "
            "families of single-stage, non-expert-parallel profiles: simulate or compare it instead"
        )
    # a profile of the user's own: its family is searched and nothing is derived
    model = opts.get("model") if "profile" in given else model_of(spec, setup, opts)
    engine = setup.engine_for(*_gpu_of(opts, given))  # vLLM's own limits where the framework leaves them to it
    axes = {
        "gpus": str(setup.num_gpus), "placement": setup.placement, "tp": str(setup.tp),
        "train_share": f"{setup.train_gpus / setup.num_gpus:g}" if setup.placement == "disaggregated" else "0.25,0.5",
        "max_num_seqs": str(engine.max_num_seqs or ""),
        "gpu_memory_utilization": f"{setup.engine.gpu_memory_utilization or ''}",
        "max_response_len": str(setup.max_response_len), "policies": setup.policy,
        "rollout_engine": setup.engine.rollout_engine,
    }  # fmt: skip
    out = {k: (opts[k] if k in given else v) for k, v in axes.items()}
    fields = opts["engine"].__dataclass_fields__
    keys = (*setup.engine_keys, *(("max_num_batched_tokens",) if setup.vllm_defaults else ()))
    fixed = {k: getattr(engine, k) for k in keys if k not in FROM_AXES and k in fields}
    return out | {
        "prompts_per_step": setup.prompts_per_step, "samples_per_prompt": setup.samples_per_prompt,
        "trainer": setup.trainer.text(), "engine": dataclasses.replace(opts["engine"], **fixed),
        "use_kl_loss": setup.use_kl_loss, "model": model, "dtype": setup.dtype or opts["dtype"],
        "model_path": setup.model_path, "max_model_len": setup.max_model_len,
        "kv_cache_dtype": setup.kv_cache_dtype,
    }  # fmt: skip


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


def _checkpoint(model: str | None) -> str | None:
    """`--model`'s checkpoint folder where it names a config.json or its folder (else None: a name
    rlsim knows, written as its Hugging Face id)."""
    if model is None:
        return None
    path = Path(model)
    if path.is_file():
        return str(path.parent)
    return str(path) if path.is_dir() else None


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
    def sweep(
        ctx: typer.Context,
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
        from rlsim.plan.grid import load_grid
        from rlsim.plan.sweep import check_caps, existing_rows, make_executor, run_sweep

        check_output_file(out, "--out")
        claim_output(ctx, out, "--out")
        g = load_grid(grid)
        check_caps(g)
        done = len(existing_rows(g, out, keep_other_grids=force)[0])  # refuses another grid's rows before a pool starts
        say_if_compiling()
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
    @engine_options(exclude=(*SEARCHED_ENGINE_FIELDS, "rollout_engine"))  # searched: lists of values, below
    def plan(
        ctx: typer.Context,
        engine: EngineConfig,
        target_epoch_hours: float | None = typer.Option(
            None, help="Objective: the fewest GPU-hours per epoch with an epoch within this many hours."
        ),
        gpu_budget: int | None = typer.Option(None, help="Objective: the fastest epoch on at most this many GPUs."),
        trace: Path | None = typer.Option(None, help="Parquet trace (default: the bundled math17k)."),
        profile: str = PROFILE,
        model: str | None = derive_opts.MODEL,
        gpu: str | None = derive_opts.GPU,
        dtype: str = derive_opts.DTYPE,
        trainer: str = derive_opts.TRAINER,
        terms: str | None = derive_opts.TERMS,
        gpus: str = typer.Option("8..256", help="GPU counts: a range (powers of two, 8..256) or a list (16,32,64)."),
        placement: str = typer.Option("colocated", help="Placements to try: colocated, disaggregated, or both."),
        train_share: str = typer.Option(
            "0.25,0.5", help="Disaggregated: fractions of the GPUs for training (rollout rounded to whole instances)."
        ),
        tp: str = typer.Option(
            "", help="Rollout TP sizes to try, e.g. 2,4,8 (default: the profile's own; with --model, 1,2,4,8 where "
            "the weights fit)."
        ),
        max_num_seqs: str = typer.Option("", help="vLLM max_num_seqs values to try, e.g. 256,1024."),
        gpu_memory_utilization: str = typer.Option("", help="vLLM gpu_memory_utilization values to try, e.g. 0.5,0.8."),
        max_response_len: str = typer.Option("20480", help="Response caps to try, e.g. 16384,20480."),
        max_model_len: int | None = options.MAX_MODEL_LEN,
        staleness: str = typer.Option(
            "", help="Staleness bounds to try for the policies that have one (fully_async's staleness_threshold, "
            "areal's max_head_offpolicyness), e.g. 0.1,0.5,1."
        ),
        policies: str = typer.Option("", help="Comma-separated policies (default: every registered one but oracle)."),
        rollout_engine: str = typer.Option(
            "vllm", help="Whose scheduling rules to try: vllm, sglang, or both (vllm,sglang: each candidate under "
            "each; speculating policies under vLLM's only)."
        ),
        prompts_per_step: int = typer.Option(512, help="P0: prompts per step."),
        samples_per_prompt: int = typer.Option(16, help="R0: samples per prompt."),
        steps: int = typer.Option(6, help="Steps simulated per finalist (0: the whole epoch)."),
        min_steps: int = typer.Option(2, help="Steps simulated per candidate in the first round of halving."),
        eta: int = typer.Option(3, help="Each round keeps the best 1/eta per policy, at eta times the steps."),
        seeds: int = typer.Option(3, help="Data-order seeds the finalists are simulated under (error bars)."),
        executor: str = typer.Option("process", help="process (a local pool) or ray (a Ray cluster)."),
        workers: int = typer.Option(0, min=0, help="Worker processes (0: one per core)."),
        ray_address: str | None = typer.Option(None, help="Address of a running Ray cluster (ray executor)."),
        cache: Path | None = typer.Option(None, help="Estimate cache (JSON lines; default ~/.cache/rlsim/plan.jsonl)."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the cache."),
        plot: Path | None = typer.Option(None, help="Write the candidates, Pareto front and finalists (PNG)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        emit: list[str] | None = typer.Option(  # one value (`single`)
            None, "--emit", help="Write the best configuration as a framework's config, FRAMEWORK:PATH: verl:PATH (a "
            "launch's overrides) or nemo-rl:PATH (a recipe over NeMo RL's grpo_math_1B.yaml).", callback=once("--emit"),
        ),
        force: bool = typer.Option(False, "--force", help="Overwrite an existing --emit file."),
        from_: list[str] | None = FROM,  # one value (`single`)
    ) -> None:
        """Search GPUs, placement, rollout TP, engine knobs and response cap per policy; the best
        configuration per policy with error bars over seeds, and the Pareto front."""
        from policies.registry import REGISTRY, split_policies
        from rlsim.config import RLConfig
        from rlsim.derive.cache import derive_family
        from rlsim.paths import check_output_file, check_plot_file, default_trace
        from rlsim.plan.cache import PlanCache, default_cache_path
        from rlsim.plan.planner import PlanConfig
        from rlsim.plan.planner import plan as run_plan
        from rlsim.plan.report import answer_rows, band_lines, objective_text, pareto_rows, plot_plan
        from rlsim.plan.space import SearchSpace, candidates, disaggregated_only, parse_gpus, parse_list
        from rlsim.plan.sweep import make_executor
        from rlsim.trace.format import load

        from_, emit = single(from_), single(emit)
        if plot is not None:
            check_plot_file(plot)  # before minutes of simulation, not after
        emit_to = _emit_target(ctx, emit, force)
        cache_path = None if no_cache else (cache or default_cache_path())
        if cache_path is not None and (cache_path.is_dir() or cache_path.parent.exists()):
            check_output_file(cache_path, "--cache")  # a missing cache directory is created
        cfg = PlanConfig(target_epoch_hours, gpu_budget, steps, min_steps, eta, seeds)
        use_kl_loss, kv_cache_dtype = False, None
        if from_ is not None:  # the axes not named on the command line, and the rest, from the config
            a = _from_config(ctx, from_, dict(locals()))
            gpus, placement, train_share, tp, max_num_seqs = a["gpus"], a["placement"], a["train_share"], a["tp"], a[
                "max_num_seqs"
            ]
            gpu_memory_utilization, max_response_len, policies = a["gpu_memory_utilization"], a["max_response_len"], a[
                "policies"
            ]
            rollout_engine, prompts_per_step, samples_per_prompt = a["rollout_engine"], a["prompts_per_step"], a[
                "samples_per_prompt"
            ]
            trainer, engine, use_kl_loss, model = a["trainer"], a["engine"], a["use_kl_loss"], a["model"]
            dtype, kv_cache_dtype, max_model_len = a["dtype"], a["kv_cache_dtype"], a["max_model_len"]
        # the model as --emit names it: the config's path, else --model's checkpoint folder (its config.json's)
        emit_model = a["model_path"] if from_ is not None else _checkpoint(model)
        say_if_compiling()
        tps = parse_list(tp, int, "--tp")
        if model is not None or gpu is not None:  # the family of derived profiles, one per TP
            utils = parse_list(gpu_memory_utilization, float, "--gpu-memory-utilization")
            least = min(utils) if utils else engine.gpu_memory_utilization  # the weights fit at every one searched
            profile, tps = derive_family(model, gpu, tps, dtype, trainer, terms, least, kv_cache_dtype)
        # HistoSpec variants are left out by default: a plan estimates an epoch from its first
        # steps, where no prompt has a previous visit to draft from yet.
        # By default every registered policy but the oracle and k_step_off (at its default k it is
        # one_step_off); those that run only disaggregated, where that placement is searched.
        places = parse_list(placement, str, "--placement")
        names = split_policies(policies) or [
            p for p in REGISTRY
            if p not in ("oracle", "k_step_off") and ("disaggregated" in places or not disaggregated_only(p))
        ]  # fmt: skip
        space = SearchSpace(
            policies=tuple(names), gpus=parse_gpus(gpus), placements=parse_list(placement, str, "--placement"),
            train_shares=parse_list(train_share, float, "--train-share"), tps=tps,
            max_num_seqs=parse_list(max_num_seqs, int, "--max-num-seqs") or (None,),
            gpu_memory_utilization=parse_list(gpu_memory_utilization, float, "--gpu-memory-utilization") or (None,),
            max_response_len=parse_list(max_response_len, int, "--max-response-len"),
            staleness=parse_list(staleness, float, "--staleness"),
            rollout_engines=tuple(e.rollout_engine for e in engine.per_rollout_engine(rollout_engine)),
        )  # fmt: skip
        rl = RLConfig(prompts_per_step=prompts_per_step, samples_per_prompt=samples_per_prompt, epochs=1,
                      use_kl_loss=use_kl_loss, max_model_len=max_model_len)  # fmt: skip
        path = trace or default_trace()
        load(path, columns=[])  # a bad trace fails here, in one sentence, before a pool starts
        candidates(space, profile, gpu_budget, engine)  # and a bad search space
        say_which_rules(profile, list(space.rollout_engines))
        prog, task = _bar("planning", 0)
        total, done = [0], [0]

        def start(n: int) -> None:
            total[0] = n
            prog.update(task, total=n)

        def tick() -> None:  # the front's early points may add a few estimates past the plan
            done[0] += 1
            prog.update(task, completed=done[0], total=max(total[0], done[0]))

        pool = make_executor(executor, workers or None, ray_address)
        t0 = time.perf_counter()
        try:
            with prog:
                res = run_plan(
                    path, space, profile, rl, cfg, pool, PlanCache(cache_path),
                    on_done=lambda _: tick(), engine=engine, on_start=start,
                    framework=from_.partition(":")[0] if from_ else None,
                )  # fmt: skip
        finally:
            pool.shutdown(cancel_futures=True)
        wall = time.perf_counter() - t0
        if plot is not None:
            plot_plan(res, plot)
        if as_json:
            typer.echo(json.dumps(res, indent=2, default=str))
            if emit_to is not None:
                _emit_best(res, emit_to, rl, emit_model)
            return
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
            if target_epoch_hours is not None
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
            + (f" ({cache_path})" if cache_path else "") + f", {wall:.1f} s"
        )
        if plot is not None:
            con.print(f"plot: {plot}")
        if emit_to is not None:  # last: a configuration the framework cannot run is refused after the answer
            _emit_best(res, emit_to, rl, emit_model)
