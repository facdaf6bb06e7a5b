"""`rlsim run --real` and `rlsim validate`: real vLLM engines under the simulator's policies."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.table import Table

from rlsim.cli.engine_options import config_options, engine_options, field_option
from rlsim.cli.from_config import FROM, single
from rlsim.cli.run_options import ProfileOptions, RunOptions, same_as
from rlsim.cli.ui import console as make_console
from rlsim.cli.ui import engine_log
from rlsim.config import EngineConfig, option_field
from rlsim.errors import RlsimError
from rlsim.real.config import RealConfig
from rlsim.text import counted


@dataclass(frozen=True, slots=True)
class RealRunOptions:
    """The cluster and the RL batch of a real run, as `rlsim run --real` takes them."""

    gpus: int = option_field(1, "Rollout GPUs (on a CPU machine: CPU instances x rollout TP).")
    steps: int | None = option_field(None, "RL steps to run (default: every epoch).")
    profile: str | None = option_field(
        None, "Profile for modeled training and policies that plan (a calibrated one for this machine)."
    )
    prompts_per_step: int = option_field(8, "P0: prompts per step.")
    samples_per_prompt: int = option_field(4, "R0: samples per prompt.")
    max_response_len: int | None = option_field(None, "Response cap (default: the trace's).")
    epochs: int = option_field(1, "Epochs over the trace's prompts.")
    placement: str = same_as(RunOptions, "placement")
    train_gpus: int = same_as(RunOptions, "train_gpus")
    dispatch: str = same_as(RunOptions, "dispatch")
    seed: int = same_as(RunOptions, "seed")
    use_kl_loss: bool = option_field(
        False, "KL loss against a frozen reference model (DAPO drops it); with --train grpo a reference copy "
        "scores every batch (timing_s/ref).", "--use-kl-loss",
    )  # fmt: skip

    def configs(self, trace):  # noqa: ANN001, ANN201 - (ClusterConfig, RLConfig)
        """The run's cluster and RL configs, its response cap checked against the trace's."""
        from rlsim.config import ClusterConfig, RLConfig

        cap = trace.meta.max_response_len if self.max_response_len is None else self.max_response_len
        if cap <= 0:
            raise RlsimError(f"--max-response-len must be positive, got {cap}")
        if cap > trace.meta.max_response_len:
            raise RlsimError(f"max_response_len={cap} exceeds the trace's cap {trace.meta.max_response_len}")
        cluster = ClusterConfig(
            num_gpus=self.gpus, profile=self.profile or "h100-qwen2.5-32b-tp2", placement=self.placement,
            train_gpus=self.train_gpus, dispatch=self.dispatch,
        )  # fmt: skip
        rl = RLConfig(
            prompts_per_step=self.prompts_per_step, samples_per_prompt=self.samples_per_prompt, max_response_len=cap,
            epochs=self.epochs, max_steps=self.steps, seed=self.seed, use_kl_loss=self.use_kl_loss,
        )  # fmt: skip
        return cluster, rl


def register(app: typer.Typer) -> None:
    """Add the real-mode commands to the top-level app."""
    from rlsim.cli.options import TRACE

    @app.command()
    # real engines keep their KV through training; vLLM's, or SGLang's with --rollout-engine sglang
    @engine_options(exclude=("free_cache_engine",))
    @config_options(RealConfig, "cfg", exclude=("dtype", "histospec_k"))
    @config_options(RealRunOptions, "opts")
    def run(
        ctx: typer.Context,
        engine: EngineConfig,
        cfg: RealConfig,
        opts: RealRunOptions,
        real: bool = typer.Option(
            False,
            "--real",
            help="Drive real engines, vLLM's or SGLang's (--rollout-engine): the only mode of this command.",
        ),
        out: Path = typer.Option(..., "--out", "-o", help="Run directory (written as the run goes)."),
        resume: bool = typer.Option(False, "--resume", help="Continue the interrupted run in --out."),
        trace: Path | None = TRACE,
        policy: str = typer.Option("sync", help="Policy string, as for `rlsim simulate`."),
    ) -> None:
        """Run the RL step loop against real vLLM (or SGLang) engines with the simulator's driver and policies."""
        from rlsim.cli.options import claim_output
        from rlsim.real.run import RealRun

        if not real:
            raise RlsimError("rlsim run drives real engines: add --real (to simulate, use rlsim simulate)")
        if resume:
            claim_output(ctx, out, "--out")
            run_ = RealRun.resume(out, opts.steps)
        else:
            run_ = _start(ctx, out, trace, policy, cfg, opts, engine)
        summary = _drive(run_, out)
        con = make_console()
        con.print(
            f"{counted(summary['num_steps'], 'step')} in {summary['total_time_s']:.2f} s: rollout "
            f"{summary['rollout_share']:.1%} of the step, bubble {summary['bubble_ratio']:.1%}, "
            f"{summary['wasted_tokens']:,.0f} wasted tokens, "
            f"KV blocks per engine {summary.get('num_gpu_blocks')}"
        )
        con.print(f"run directory: {out} (summary.json holds every figure; the engines' log: vllm.log)")

    @app.command()
    def validate(
        ctx: typer.Context,
        run_dir: Path | None = typer.Argument(None, help="Run directory written by rlsim run --real."),
        profile: str | None = typer.Option(None, help="Profile to simulate with (default: the run's)."),
        as_json: bool = typer.Option(False, "--json", help="Print results as JSON."),
        verl_metrics: Path | None = typer.Option(
            None, help="A veRL run's per-step metrics (file logger JSON Lines, or console log) instead of RUN_DIR."
        ),
        log: Path | None = typer.Option(
            None, help="With --verl-metrics: the same steps' rollout dump or PolyTrace log."
        ),
        gpus: int | None = typer.Option(None, help="With --verl-metrics: the run's rollout GPUs."),
        policy: str = typer.Option("sync", help="With --verl-metrics: the policy the run used."),
        log_format: str = typer.Option("auto", "--format", help="With --verl-metrics: the log's format."),
        tokenizer: Path | None = typer.Option(None, help="With --verl-metrics and a veRL dump: its tokenizer."),
        from_: list[str] | None = FROM,  # one value (`single`)
        metrics: Path | None = typer.Option(
            None, help="With --from: the run's logged per-step metrics (veRL's file logger JSON Lines, or console log)."
        ),
        trace: Path | None = typer.Option(
            None, help="With --from: the run's lengths as a trace (default: a stand-in at the log's mean length)."
        ),
        gpu: str | None = field_option(ProfileOptions, "gpu"),
        model: str | None = field_option(ProfileOptions, "model"),
        dtype: str = field_option(ProfileOptions, "dtype"),
        terms: str | None = field_option(ProfileOptions, "terms"),
    ) -> None:
        """Simulate a recorded real run and print real vs simulated with Diff%, and where it comes from; with --from
        and --metrics, a run of your framework's against its own config, phase by phase."""
        from_ = single(from_)
        if from_ is not None:
            if metrics is None or run_dir is not None or verl_metrics is not None:
                raise RlsimError("--from validates the run its config describes against --metrics FILE (no RUN_DIR)")
            from rlsim.cli.from_config import apply_from

            given = {"profile": profile, "gpu": gpu, "model": model, "dtype": dtype, "terms": terms}
            opts, engine, setup = apply_from(ctx, from_, given, EngineConfig(), extra=("policy",))  # its own mode
            res = _validate_from(metrics, trace, log, log_format, tokenizer, opts["profile"], engine, setup)
        elif metrics is not None or trace is not None or terms is not None:
            raise RlsimError("--metrics, --trace and --terms go with --from: the run's config says what to simulate")
        else:
            res = _validate_run(run_dir, verl_metrics, log, profile, gpus, policy, log_format, tokenizer)
        for note in res.get("notes") or ():  # what the metrics file held that was skipped or superseded
            make_console(sys.stderr).print(f"note: {note}", highlight=False, soft_wrap=True)
        if as_json:
            typer.echo(json.dumps(res, indent=2))
        else:
            _print_validation(res)


def _start(ctx, out: Path, trace: Path | None, policy: str, cfg, opts: RealRunOptions, engine: EngineConfig):  # noqa: ANN001, ANN202
    """A new real run in `out` (claimed, checked), its config written: `rlsim.real.run.RealRun`."""
    from rlsim.cli.options import claim_output, load_trace
    from rlsim.paths import check_output_dir
    from rlsim.real.run import RealRun

    check_output_dir(out, "--out")
    claim_output(ctx, out, "--out")
    if cfg.model is None:
        raise RlsimError("--model is required: a model directory or a Hugging Face id in the local cache")
    if cfg.train == "modeled" and opts.profile is None:
        raise RlsimError(
            "--train modeled needs --profile (one calibrated for this machine and model: rlsim calibrate "
            "fit), or pass --train none"
        )
    tr = load_trace(trace)
    cluster, rl = opts.configs(tr)
    return RealRun.start(out, trace or _default_trace(), policy, cluster, rl, cfg, cluster.profile, engine)


def _drive(run_, out: Path) -> dict:  # noqa: ANN001 - rlsim.real.run.RealRun
    """Run to the end under a progress bar, a line per step above it, the engines' own lines in the
    run directory's log; its summary (exit 130, saying how to resume, on Ctrl-C)."""
    from rlsim.cli.options import step_progress

    log = out / "vllm.log"
    try:
        # vLLM's start-up and warning lines go to the run directory, not over the progress
        with engine_log(log) as term:
            prog, cb = step_progress(run_.total_steps(), f"real run: {run_.policy}", auto_refresh=False, file=term)
            make_console(term).print(f"engines' log: {log}")

            def step_line(row: dict) -> None:  # printed above the bar as each step ends
                gen = row["timing_s/gen"]
                tokens = row["response_length/mean"] * row["num_samples"]
                rate = f"{tokens / gen:,.0f} trained tok/s" if gen > 0 else "-"
                score = row.get("critic/score/mean")
                learned = "" if score is None or score != score else (
                    f", score {score:+.3f}, update {row['timing_s/update_actor']:.2f} s, "
                    f"weights {row['timing_s/update_weights']:.2f} s"
                )  # fmt: skip
                prog.console.print(
                    f"step {row['step']:.0f}: rollout {gen:.2f} s, {rate}, mean length "
                    f"{row['response_length/mean']:,.0f}, step {row['timing_s/step']:.2f} s{learned}"
                )

            with prog:
                return run_.run(progress=cb, on_step_row=step_line, say=prog.console.print)
    except KeyboardInterrupt:
        make_console().print(f"interrupted; finished steps are in {out}; continue: rlsim run --real --resume -o {out}")
        raise typer.Exit(130) from None


def _validate_run(run_dir, verl_metrics, log, profile, gpus, policy, log_format, tokenizer) -> dict:  # noqa: ANN001
    """`rlsim validate RUN_DIR` (a real run of rlsim's), or `--verl-metrics FILE --log DIR` (a veRL run)."""
    if verl_metrics is not None or log is not None:
        if run_dir is not None:
            raise RlsimError("give either RUN_DIR or --verl-metrics with --log, not both")
        missing = [n for n, v in (("--verl-metrics", verl_metrics), ("--log", log), ("--profile", profile),
                                  ("--gpus", gpus)) if v is None]  # fmt: skip
        if missing:
            raise RlsimError(f"validating a veRL run needs {', '.join(missing)}")
        from rlsim.real.validate_verl import validate_verl

        return validate_verl(verl_metrics, log, profile, gpus, policy, log_format, tokenizer)
    if run_dir is None:
        raise RlsimError("give a run directory (rlsim run --real --out DIR), or --verl-metrics FILE --log DIR")
    from rlsim.real.validate import validate as run_validate

    return run_validate(run_dir, profile)


def _validate_from(metrics, trace, log, log_format, tokenizer, profile: str, engine, setup) -> dict:  # noqa: ANN001
    """`rlsim validate --from FRAMEWORK:CONFIG --metrics FILE`: the config's run (its own mode, on
    `profile`) on its lengths (`--trace`, or the rollout dump `--log`) or a stand-in, against the
    logged phases."""
    from rlsim.bands import band_text, for_prediction
    from rlsim.profile import load_profile
    from rlsim.real.validate_verl import validate_config
    from rlsim.trace.format import load
    from rlsim.trace.importers import import_logs

    if trace is not None and log is not None:
        raise RlsimError("give the run's lengths once: --trace or --log")
    lengths = load(trace) if trace is not None else None
    if log is not None:
        lengths = import_logs(Path(log), log_format, None, None, tokenizer).trace
    res = validate_config(metrics, setup, profile, engine, setup.policy, lengths)
    # what the prediction rests on: the profile's basis (derived, fitted, measured or calibrated) and its band
    res["error_band"] = band_text(for_prediction(load_profile(profile), engine.rollout_engine,
                                                 setup.framework)["error_band"])  # fmt: skip
    return res


def _print_validation(res: dict) -> None:
    """Real against simulated, metric by metric, with what the prediction rests on and where the
    difference comes from."""
    table = Table(title=f"{res['policy']}: real vs simulated ({counted(res['steps'], 'step')}, "
                  f"{counted(res['instances'], 'instance')})")  # fmt: skip
    for col in ("metric", "real", "simulated", "Diff%"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for r in res["rows"]:
        d = r["diff_pct"]
        table.add_row(r["label"], _fmt(r["real"]), _fmt(r["sim"]), "n/a" if d is None else f"{d:+.1f}%")
    src = f" ({res['profile_source']})" if res.get("profile_source") else ""
    table.caption = f"profile {res['profile']}{src}; Diff% = (simulated - real) / real"
    if res.get("stand_in"):
        table.caption += f"; lengths: {res['stand_in']}"
    console = make_console()
    console.print(table)
    if res.get("error_band"):
        console.print(f"the prediction's {res['error_band']}", highlight=False, soft_wrap=True)
    if res.get("phases"):
        print_phases(console, res["phases"], res["profile"])
    if "parts" in res:
        print_parts(console, res["parts"])
    else:
        console.print(f"{counted(res['gpus'], 'GPU')} on profile {res['profile']}; per step: --json")


def print_phases(console, phases: list[dict], profile: str) -> None:  # noqa: ANN001 - a rich Console
    """The phase-by-phase table of a `--train grpo` run: measured vs the profile's costs."""
    table = Table(title="the step phase by phase (s per step, mean)")
    for col in ("phase", "real", "simulated", "Diff%"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for r in phases:
        d = r["diff_pct"]
        table.add_row(f"{r['label']} ({r['phase']})", _fmt(r["real"]), "-" if r["sim"] is None else _fmt(r["sim"]),
                      "n/a" if d is None else f"{d:+.1f}%")  # fmt: skip
    table.caption = f"training phases simulated with profile {profile}'s train block (rlsim calibrate train)"
    console.print(table)


def print_parts(console, parts: dict) -> None:  # noqa: ANN001 - a rich Console
    """The decomposition table of `rlsim validate` and its notes (schedule, model, load)."""

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:+.1f}%"

    table = Table(title="where the difference comes from (Diff% of the real figure)")
    for col in ("part", "rollout time", "step time", "computed as"):
        table.add_column(col, justify="left" if col in ("part", "computed as") else "right")
    sched, model = parts.get("schedule", {}), parts.get("iteration_model", {})
    if "not_measured" in sched:
        console.print(table.title + ": " + sched["not_measured"])
    else:
        fo = sched["finish_order"]
        table.add_row("driver time between iterations", pct(sched["rollout_time_pct"]),
                      pct(sched["step_time_pct"]), "replayed with each iteration's measured time")  # fmt: skip
        table.add_row("iteration model", pct(model["rollout_time_pct"]), pct(model["step_time_pct"]),
                      f"profile vs measured, {model['iterations']:,} iterations")  # fmt: skip
        table.add_row("total", pct(parts["total"]["rollout_time_pct"]), pct(parts["total"]["step_time_pct"]),
                      "simulated with the profile")  # fmt: skip
        console.print(table)
        it = sched["iterations"]
        gap_ms = 1e3 * (fo["finish_abs_diff_median_s"] or 0.0)
        console.print(
            f"replay: {it['same_batch']:,} of {it['simulated']:,} simulated iterations had the real one's batch "
            f"({it['real']:,} real); finish order Kendall tau {fo['kendall_tau']}, same order in "
            f"{fo['steps_same_order']} steps, median finish-time difference {gap_ms:.1f} ms; the real rollout "
            f"spent {sched['driver_time_pct']:.1f}% of its time outside engine iterations (the driver's own "
            "work, not simulated)"
        )
        by = ", ".join(f"B {k}: {v['signed_pct']:+.1f}%" for k, v in model["by_batch"].items())
        console.print(f"iteration model: MAPE {model['mape']:.1%}, summed {model['total_time_pct']:+.1f}% ({by})")
    load = parts.get("load", {})
    from rlsim.hostload import describe

    console.print(f"load: calibration {describe(load.get('calibration'))}; run {describe(load.get('run'))}")
    if load.get("machine_pct") is not None:
        probe = load.get("probe", "probe_ms").replace("_ms", "").replace("_", " ")
        console.print(f"machine: the {probe} alone predicts {load['machine_pct']:+.1f}% for the total")
    if load.get("warning"):
        console.print(f"warning: {load['warning']}")


def _fmt(x: float) -> str:
    x = 0.0 if abs(x) < 5e-4 else x  # no "-0.000"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3f}"


def _default_trace() -> Path:
    from rlsim.paths import default_trace

    return default_trace()
