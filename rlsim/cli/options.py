"""Options and helpers the command groups share: one definition and one help text per option, the
configs built from them (with a real log's own batch as default), the trace loaded with only the
columns the policies need, and the step progress bar."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rlsim.cli.ui import console as make_console
from rlsim.cli.ui import shown_profile
from rlsim.errors import RlsimError

# The trace option of the commands that read one; the run's other options are declared once, by the
# config objects they build (`rlsim.cli.run_options`, `rlsim.cli.engine_options`).
TRACE = typer.Option(None, help="Parquet trace (default: the bundled traces/math17k.parquet).")


def refuse_overwrite(out: Path, force: bool) -> None:
    """`--out` must be writable, and an existing file is kept unless `--force` (every command that
    writes one named file: trace synth and import, profile derive)."""
    from rlsim.paths import check_output_file

    check_output_file(out, "--out")
    if out.exists() and not force:
        raise RlsimError(f"{out} already exists; pass --force to overwrite it")


def load_trace(trace: Path | None, policies: list[str] = ()):  # noqa: ANN202
    """The trace with only the columns the run needs (token ids only for HistoSpec, rewards only
    for dynamic sampling, per-sample reward times when the trace has them)."""
    import pyarrow.parquet as pq

    from rlsim.paths import default_trace
    from rlsim.trace.format import load

    path = trace or default_trace()
    want = ["reward_time_s", "step"]
    if any("histospec" in p for p in policies):
        want.append("output_token_ids")
    if any("dynamic_sampling" in p for p in policies):
        want.append("reward")
    try:
        names = pq.read_schema(path).names if path.is_file() else []
    except Exception:  # noqa: BLE001 - load() below names what is wrong with the file
        names = []
    return load(path, columns=[c for c in want if c in names])


def check_len(trace, max_len: int, max_model_len: int | None = None) -> None:  # noqa: ANN001
    """Refuse a run whose requests could run past the trace's cap: each request is capped at
    `max_len`, or with `max_model_len` at min(max_len, max_model_len less its prompt), as vLLM
    caps it (a trace capped at the model length less each prompt fits a run capped the same way)."""
    cap = trace.meta.max_response_len
    if max_model_len is not None and not 1 < max_model_len < 2**31:
        raise RlsimError(f"--max-model-len must be between 2 and {2**31 - 1:,} tokens, got {max_model_len}")
    if max_model_len is None:
        if max_len > cap:
            raise RlsimError(
                f"max_response_len={max_len} exceeds the trace's cap {cap}: the trace does not say how long "
                "responses would run past it"
            )
        return
    prompts = trace.table["num_prompt_tokens"].astype("int64")
    if len(prompts) and int(prompts.max()) >= max_model_len:
        raise RlsimError(
            f"a prompt of {int(prompts.max()):,} tokens leaves no room under max_model_len={max_model_len:,}: vLLM "
            "refuses it; raise max_model_len or filter the trace's long prompts"
        )
    per_request = (max_model_len - prompts).clip(upper=max_len)
    if len(prompts) and int(per_request.max()) > cap:
        raise RlsimError(
            f"max_response_len={max_len} with max_model_len={max_model_len:,} lets a {int(prompts.min()):,}-token "
            f"prompt's response run to {int(per_request.max()):,} tokens, past the trace's cap {cap}: the trace "
            "does not say how long responses would run past it"
        )


def claim_output(ctx: typer.Context, path: Path, what: str) -> None:
    """Claim a command's output before any work (`rlsim.claim`), held until the command (`ctx`) ends,
    however it ends: a second command writing the same output is refused, naming this one's pid."""
    from rlsim.claim import claimed

    ctx.with_resource(claimed(Path(path), what))


def say_if_compiling() -> None:
    """Say so, on stderr, when the simulator's compiled core is not in its cache yet: its first
    compile takes a minute or more, during which the progress bar would sit at 0 with no word why."""
    from rlsim.sim.compiled.sim_engine import core_compiled

    if not core_compiled():
        make_console(sys.stderr).print(
            "compiling the simulator's core: the first run after installing or upgrading rlsim takes about a "
            "minute longer (docs/speed.md); later runs load it from the cache"
        )


def say_which_rules(profile: str, rollout_engines: list[str]) -> None:
    """One line on stderr for each engine whose rules the run schedules with where it is not
    vLLM's (which implementation runs them), and one where the profile's costs were measured on
    another engine than those rules."""
    from rlsim.profile import load_profile
    from rlsim.rollout_engines import REGISTRY

    err = make_console(sys.stderr)
    loaded = load_profile(profile)
    measured = loaded.rollout_engine
    if loaded.data_parallel_size > 1:
        err.print(
            f"data-parallel attention: groups of {loaded.data_parallel_size} ranks in lockstep, iteration by iteration "
            "on SimEngine (the compiled core runs independent instances only)",
            highlight=False,
        )
    compiled = " and ".join(e.label for e in REGISTRY.values() if e.compiled)
    for engine in rollout_engines:
        rules = REGISTRY[engine]
        if not rules.compiled:
            err.print(
                f"scheduling with {rules.label} {rules.version}'s rules, on SimEngine (the compiled core runs "
                f"{compiled}'s rules only)",
                highlight=False,
            )
        if measured != engine:
            err.print(
                f"profile {shown_profile(profile)}: its costs were measured on {REGISTRY[measured].label}; this run "
                f"schedules with {rules.label}'s rules on them",
                highlight=False,
            )


def step_progress(total_steps: int, label: str, auto_refresh: bool = True, file=None):  # noqa: ANN001, ANN202
    """A step progress bar and its callback. Real runs pass `auto_refresh=False`: the bar then
    redraws only when a step ends, since a refresh thread would compete with the engine for the
    CPU and slow the very iterations being timed."""
    prog = Progress(
        TextColumn(label),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TimeElapsedColumn(),
        console=make_console(file),
        transient=True,
        auto_refresh=auto_refresh,
    )
    task = prog.add_task(label, total=total_steps)

    def update(step: int, now: float) -> None:
        prog.update(task, completed=step)
        if not auto_refresh:
            prog.refresh()

    return prog, update


def expected_steps(trace, rl) -> int:  # noqa: ANN001
    per_epoch = math.ceil(trace.num_prompts / rl.prompts_per_step)
    n = per_epoch * rl.epochs
    return min(n, rl.max_steps) if rl.max_steps else n
