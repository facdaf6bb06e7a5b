"""`rlsim simulate` and `rlsim compare`: policies on a trace and a simulated cluster."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlsim.cli.ui import console as make_console
from rlsim.errors import RlsimError

# Options shared by `simulate` and `compare` (one definition, one help text).
TRACE = typer.Option(None, help="Parquet trace (default: the bundled traces/math17k.parquet).")
GPUS = typer.Option(64, help="Total GPUs.")
PROFILE = typer.Option(
    "h100-qwen2.5-32b-tp4", help="Shipped profile name or JSON path (default: rollout TP 4, as veRL's DAPO recipe)."
)
PLACEMENT = typer.Option("colocated", help="colocated or disaggregated.")
TRAIN_GPUS = typer.Option(0, help="Training GPUs (disaggregated only).")
DISPATCH = typer.Option(
    "least_loaded",
    help="least_loaded (each sample to the instance with the fewest unfinished requests, as veRL's agent loop), "
    "round_robin (sample by sample) or per_prompt (a prompt's samples together).",
)
GPU_MEMORY_UTILIZATION = typer.Option(
    None, help="vLLM gpu_memory_utilization; re-derives KV capacity (default: the profile's, veRL's 0.5)."
)
MAX_NUM_SEQS = typer.Option(None, help="vLLM max_num_seqs (default: the profile's, veRL's 1024).")
MAX_NUM_BATCHED_TOKENS = typer.Option(
    None, help="vLLM max_num_batched_tokens (default: the profile's, veRL's 8192)."
)
PREFIX_CACHING = typer.Option(True, "--enable-prefix-caching/--no-enable-prefix-caching", help="vLLM prefix caching.")
CHUNKED_PREFILL = typer.Option(
    True, "--enable-chunked-prefill/--no-enable-chunked-prefill", help="vLLM chunked prefill."
)
BLOCK_SIZE = typer.Option(None, help="vLLM block_size: KV tokens per block (default: the profile's, 16).")
FREE_CACHE_ENGINE = typer.Option(
    True,
    "--free-cache-engine/--no-free-cache-engine",
    help="Colocated engines sleep through training (KV freed, weights offloaded), as veRL's hybrid engine.",
)
REWARD_LATENCY = typer.Option(
    0.05, "--reward-latency", help="Seconds to score one sample (a trace's reward_time_s column overrides it)."
)
USE_KL_LOSS = typer.Option(False, "--use-kl-loss", help="KL term on: a reference model scores every batch.")
PROMPTS_PER_STEP = typer.Option(
    None, help="P0: prompts per step (default: a real log's own, else 512 or all the trace's prompts if fewer)."
)
SAMPLES_PER_PROMPT = typer.Option(
    None, help="R0: samples per prompt, the GRPO group (default: a real log's own, else 16 or the trace's if fewer)."
)
MAX_RESPONSE_LEN = typer.Option(None, help="Response cap in tokens (default: the trace's).")
EPOCHS = typer.Option(None, help="Epochs over the trace's prompts (default: every epoch the trace holds).")
MAX_STEPS = typer.Option(None, help="Stop after this many steps.")
SEED = typer.Option(0, help="Seed of the data order.")


def _configs(opts: dict):  # noqa: ANN202
    """ClusterConfig, RLConfig and EngineConfig from a command's shared options (its locals())."""
    from rlsim.config import ClusterConfig, EngineConfig, RLConfig

    cluster = ClusterConfig(
        num_gpus=opts["gpus"],
        profile=opts["profile"],
        placement=opts["placement"],
        train_gpus=opts["train_gpus"],
        dispatch=opts["dispatch"],
    )
    rl = RLConfig(**{k: opts[k] for k in (
        "prompts_per_step", "samples_per_prompt", "max_response_len", "epochs", "max_steps", "seed", "use_kl_loss"
    )}, reward_latency_s=opts["reward_latency"])  # fmt: skip
    engine = EngineConfig(**{k: opts[k] for k in (
        "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching",
        "free_cache_engine", "block_size", "enable_chunked_prefill",
    )})  # fmt: skip
    return cluster, rl, engine


def _load(trace: Path | None, policies: list[str] = ()):  # noqa: ANN202
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


def from_trace(opts: dict, trace) -> dict:  # noqa: ANN001
    """Fill the RL options left unset (None) from the trace: its epochs, its cap, and for a real
    log its own group size and prompts per step (a synthetic trace may hold spare samples, as the
    bundled one does for RollPacker's over-provisioning, so its R0 stays DAPO's 16)."""
    meta, opts = trace.meta, dict(opts)
    real = meta.source.startswith("real:")
    per_epoch = int(trace.table.loc[trace.table["epoch"] == trace.epochs[0], "prompt_id"].nunique())
    logged = meta.source_params.get("prompts_per_step") if real else None
    defaults = {
        "epochs": len(trace.epochs),
        "max_response_len": meta.max_response_len,
        "samples_per_prompt": meta.samples_per_prompt if real else min(16, meta.samples_per_prompt),
        "prompts_per_step": int(logged) if logged else min(512, per_epoch),
    }
    for key, value in defaults.items():
        if opts.get(key) is None:
            opts[key] = value
    return opts


def _check_len(trace, max_len: int) -> None:  # noqa: ANN001
    if max_len > trace.meta.max_response_len:
        raise RlsimError(
            f"max_response_len={max_len} exceeds the trace's cap {trace.meta.max_response_len}: "
            "the trace does not say how long responses would run past it"
        )


def _progress(total_steps: int, label: str, auto_refresh: bool = True, file=None):  # noqa: ANN001, ANN202
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


def _expected_steps(trace, rl) -> int:  # noqa: ANN001
    per_epoch = math.ceil(trace.num_prompts / rl.prompts_per_step)
    n = per_epoch * rl.epochs
    return min(n, rl.max_steps) if rl.max_steps else n


def register(app: typer.Typer) -> None:
    """Add the simulation commands to the top-level app."""

    @app.command("policies")
    def policies_() -> None:
        """Every registered policy and engine feature: its knobs with defaults, and its paper."""
        import dataclasses
        import sys

        from policies.registry import REGISTRY
        from rlsim.config import DynamicSamplingConfig, SpecConfig

        def knobs(cfg) -> str:  # noqa: ANN001
            if cfg is None:
                return "none"
            return ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(cfg) if f.name != "source")

        table = Table(title="Policies (rlsim simulate --policy 'NAME(knob=value,...)+FEATURE')", title_justify="left")
        for col in ("name", "knobs (defaults)", "what and where from"):
            table.add_column(col)
        for name, cls in REGISTRY.items():
            doc = (sys.modules[cls.__module__].__doc__ or cls.__doc__ or "").strip().splitlines()
            table.add_row(name, knobs(getattr(cls, "Config", None)), doc[0] if doc else "")
        table.add_row("+histospec", knobs(SpecConfig), "engine feature: RhymeRL HistoSpec, drafts from the last visit")
        table.add_row("+grouped_spec", knobs(SpecConfig), "engine feature: Seer, drafts from sibling responses")
        table.add_row("+dynamic_sampling", knobs(DynamicSamplingConfig), "DAPO: drops zero-variance groups")
        table.caption = "your own policy: module:Class, a class with on_step_start and on_event (rlsim/protocol.py)"
        make_console().print(table)

    @app.command()
    def simulate(
        policy: str = typer.Option(
            "sync", help="Policy string: NAME[(knob=value,...)][+histospec], or module:Class (see `rlsim policies`)."
        ),
        trace: Path | None = TRACE,
        out: Path = typer.Option(Path("runs/sim"), "--out", "-o", help="Run directory to write."),
        gpus: int = GPUS,
        profile: str = PROFILE,
        placement: str = PLACEMENT,
        train_gpus: int = TRAIN_GPUS,
        dispatch: str = DISPATCH,
        prompts_per_step: int | None = PROMPTS_PER_STEP,
        samples_per_prompt: int | None = SAMPLES_PER_PROMPT,
        max_response_len: int | None = MAX_RESPONSE_LEN,
        epochs: int | None = EPOCHS,
        max_steps: int | None = MAX_STEPS,
        seed: int = SEED,
        gpu_memory_utilization: float | None = GPU_MEMORY_UTILIZATION,
        max_num_seqs: int | None = MAX_NUM_SEQS,
        max_num_batched_tokens: int | None = MAX_NUM_BATCHED_TOKENS,
        enable_prefix_caching: bool = PREFIX_CACHING,
        enable_chunked_prefill: bool = CHUNKED_PREFILL,
        block_size: int | None = BLOCK_SIZE,
        free_cache_engine: bool = FREE_CACHE_ENGINE,
        reward_latency: float = REWARD_LATENCY,
        use_kl_loss: bool = USE_KL_LOSS,
        exact: bool = typer.Option(False, "--exact", help="Iteration-by-iteration reference mode."),
        force: bool = typer.Option(False, "--force", help="Write into an existing run directory."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON instead of a table."),
    ) -> None:
        """Simulate one policy and write a run directory (tables, summary, timeline, trace.json)."""
        from rlsim.paths import check_output_dir
        from rlsim.report import to_json, write_run_dir
        from rlsim.sim.simulate import simulate as run

        check_output_dir(out, "--out")
        if out.exists() and any(out.iterdir()) and not force:
            raise RlsimError(f"{out} already holds files; pass --force or choose another --out")
        tr = _load(trace, [policy])
        opts = from_trace(locals(), tr)
        cluster, rl, engine = _configs(opts)
        _check_len(tr, rl.max_response_len)
        prog, cb = _progress(_expected_steps(tr, rl), f"simulating {policy}")
        with prog:
            result = run(tr, policy, cluster, rl, exact=exact, progress=cb, engine_cfg=engine)
        write_run_dir(result, out)
        if as_json:
            typer.echo(to_json(result.summary))
            return
        _print_summary(result.summary, f"{policy} | {cluster.num_gpus} GPUs, {cluster.profile}, {cluster.placement}")
        make_console().print(f"run directory: {out} (summary.json holds every figure at full precision)")

    @app.command()
    def compare(
        policies: str = typer.Option(
            "", help="Comma-separated policy strings, e.g. 'sync,rollpacker(eta_p=1.5)+histospec' (default: all)."
        ),
        trace: Path | None = TRACE,
        gpus: int = GPUS,
        profile: str = PROFILE,
        placement: str = PLACEMENT,
        train_gpus: int = TRAIN_GPUS,
        dispatch: str = DISPATCH,
        prompts_per_step: int | None = PROMPTS_PER_STEP,
        samples_per_prompt: int | None = SAMPLES_PER_PROMPT,
        max_response_len: int | None = MAX_RESPONSE_LEN,
        epochs: int | None = EPOCHS,
        max_steps: int | None = MAX_STEPS,
        seed: int = SEED,
        gpu_memory_utilization: float | None = GPU_MEMORY_UTILIZATION,
        max_num_seqs: int | None = MAX_NUM_SEQS,
        max_num_batched_tokens: int | None = MAX_NUM_BATCHED_TOKENS,
        enable_prefix_caching: bool = PREFIX_CACHING,
        enable_chunked_prefill: bool = CHUNKED_PREFILL,
        block_size: int | None = BLOCK_SIZE,
        free_cache_engine: bool = FREE_CACHE_ENGINE,
        reward_latency: float = REWARD_LATENCY,
        use_kl_loss: bool = USE_KL_LOSS,
        workers: int = typer.Option(0, min=0, help="Processes to simulate policies in parallel (0: one per core)."),
        seeds: int = typer.Option(
            1, min=1, help="Data-order seeds (--seed, --seed + 1, ...): every time with its spread, and a rank that "
            "changes between seeds marked as a tie.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print results as JSON."),
        plot: Path | None = typer.Option(None, help="Write a bar chart of epoch time per policy."),
    ) -> None:
        """Every policy on the same trace, cluster and work: epoch time, speedup, bubble, waste..."""
        from policies.registry import COMPARE_DEFAULT
        from rlsim.paths import check_output_file
        from rlsim.report import plot_compare
        from rlsim.sim.compare import compare as run_all
        from rlsim.sim.compare import compare_seeds

        if plot is not None:
            check_output_file(plot, "--plot")  # before minutes of simulation, not after
        names = _split_policies(policies) or list(COMPARE_DEFAULT)
        tr = _load(trace, names)
        cluster, rl, engine = _configs(from_trace(locals(), tr))
        _check_len(tr, rl.max_response_len)
        prog = Progress(
            TextColumn("simulating policies"), BarColumn(), TextColumn("{task.completed}/{task.total} done"),
            TextColumn("{task.description}"), TimeElapsedColumn(), console=make_console(), transient=True,
        )  # fmt: skip
        task = prog.add_task("", total=len(names) * seeds)

        def done(name: str) -> None:
            prog.update(task, advance=1, description=f"(last: {name})")

        with prog:
            if seeds > 1:
                rows = compare_seeds(tr, names, cluster, rl, seeds, workers or None, on_done=done, engine_cfg=engine)
            else:
                rows = run_all(tr, names, cluster, rl, workers or None, on_done=done, engine_cfg=engine)
        if plot is not None:
            plot_compare(rows, plot)
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
            return
        _print_compare(rows, tr, cluster, rl)
        if plot is not None:
            make_console().print(f"plot written to {plot}")


def _split_policies(text: str) -> list[str]:
    """Split on commas outside parentheses (knob lists contain commas)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    names = [p for p in [*parts, cur.strip()] if p]
    if text.strip() and not names:
        raise RlsimError(f"--policies {text!r} names no policy; leave it out for the defaults")
    return names


def _compact(n: int) -> str:
    """160, 62.7k, 1.2M: a count in a few characters, for a table that must fit a terminal."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def _print_summary(s: dict, title: str) -> None:
    """One simulated run's figures, rounded and with units (the run directory keeps them exact)."""

    def pct(key: str) -> str:
        return "-" if s.get(key) is None else f"{s[key]:.1%}"

    rows = [(f"epoch {e} time", f"{t / 3600:.2f} h") for e, t in s["epoch_time_s"].items()]
    rows += [
        ("total time", f"{s['total_time_s'] / 3600:.2f} h over {s['num_steps']} steps"),
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
    if s.get("reused_samples"):
        rows.append(("reused samples (past the trace's)", f"{s['reused_samples']:,}"))
    table = Table(title=title, title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for row in rows:
        table.add_row(*row)
    make_console().print(table)


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
            *[pm(r["epoch_time_s"].get(e, float("nan")), ranges.get(e), 3600) for e in epochs],
            sp,
            f"{r['rollout_share']:.0%}",
            f"{r['bubble_ratio']:.0%}",
            f"{r['preemptions']:,}",
            _compact(round(r["wasted_tokens"])),
            f"{r['staleness_max']:.0f}/{r['staleness_mean']:.2f}",
            f"{r['trained_length_bias']:.2f}",
            "{:.2f}-{:.2f}".format(*r["length_order_bias_range"]),
            *([_compact(r.get("reused_samples") or 0)] if reused else []),
        ])  # fmt: skip
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
    if reused:
        table.caption += (
            f"; reused: samples launched past the trace's {trace.meta.samples_per_prompt} per prompt, which "
            "replay the trace's samples again (their lengths are not new draws)"
        )
    make_console().print(table)
