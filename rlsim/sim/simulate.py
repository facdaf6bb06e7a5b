"""`simulate(...)`: one policy on one trace and cluster, returning a `Result` (no files written).

The caller decides what to write (`rlsim.report.write_run_dir`). Same config and seed, same
numbers.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time

import pandas as pd

from policies.registry import make_policy, parse_policy
from rlsim.config import ClusterConfig, EngineConfig, RLConfig, config_dict
from rlsim.driver.loop import run_loop
from rlsim.errors import RlsimError
from rlsim.profile import Profile, load_profile
from rlsim.result import Result, summarize
from rlsim.rollout_engines import rollout_engine
from rlsim.sim.engine import SimEngine
from rlsim.spec.speculation import SpecModel
from rlsim.step_costs import check_layout, with_engine
from rlsim.trace.format import Trace


def check_engine_fits(prof: Profile, trace: Trace, rl: RLConfig) -> None:
    """Refuse, in one sentence, an engine (`prof.engine`) that could never run the trace's longest request."""
    t = trace.table
    capped = t["num_output_tokens"].clip(upper=rl.response_cap(t["num_prompt_tokens"]))
    longest = int((t["num_prompt_tokens"] + capped).max()) if len(t) else 0
    if longest > prof.kv_capacity_tokens and rollout_engine(prof.engine.rollout_engine).aborts_too_long:
        return  # SGLang aborts a prompt its pool cannot hold, clips a response to it, and goes on (the summary
        # counts what it aborted: `engine_aborts`)
    if longest > prof.kv_capacity_tokens:
        raise RlsimError(
            f"a {longest}-token request of the trace (prompt plus capped response) does not fit an "
            f"instance's KV cache of {prof.kv_capacity_tokens} tokens; raise gpu_memory_utilization "
            f"or lower max_response_len"
        )
    if not prof.engine.enable_chunked_prefill and longest > prof.engine.max_num_batched_tokens:
        raise RlsimError(
            f"with chunked prefill off, max_num_batched_tokens ({prof.engine.max_num_batched_tokens}) must "
            f"hold the longest request ({longest} tokens), as vLLM requires of max_model_len"
        )


def check_setup(
    trace: Trace, cluster: ClusterConfig, rl: RLConfig, profile: Profile | str | None = None,
    engine_cfg: EngineConfig | None = None,
) -> Profile:
    """Refuse, in one sentence and before any work, a setup no policy could run (its GPUs, its engine,
    its training layout); the profile under the run's engine (`prof.engine`: its one engine
    configuration). `simulate` checks this first; a command running many policies calls it before
    the first."""
    prof = profile if isinstance(profile, Profile) else load_profile(profile or cluster.profile)
    prof = with_engine(prof, engine_cfg or EngineConfig())
    cluster.num_instances(prof.instance_gpus)
    check_engine_fits(prof, trace, rl)
    check_layout(prof, cluster.training_gpus)
    if prof.engine.parallel_sampling and cluster.dispatch != "per_prompt":
        raise RlsimError(
            "--parallel-sampling sends a prompt's samples as one request, which goes to one instance: add --dispatch "
            "per_prompt"
        )
    return prof


def compiled_covers(prof: Profile, lockstep: bool = False, lengths_sent: bool = False) -> bool:
    """Whether the compiled core runs this setup (else `SimEngine` does, with the same rules): an
    engine whose rules it holds (`RolloutEngine.compiled`), on independent instances (no data-parallel
    attention), without SGLang's lockstep answers of aborts or its reading of the lengths a replay-mode
    real run sent (each with its registry flag)."""
    rules = rollout_engine(prof.engine.rollout_engine)
    return bool(rules.compiled) and prof.data_parallel_size == 1 and not (
        lockstep and rules.outputs_after_next_launch) and not (lengths_sent and rules.reads_max_tokens)


def scheduler_name(engine_cfg: EngineConfig, impl: str) -> str:
    """Whose rules scheduled the run, and which implementation ran them."""
    rules = rollout_engine(engine_cfg.rollout_engine)
    return f"{rules.label} {rules.version} rules ({'compiled core' if impl == 'compiled' else 'SimEngine'})"


def simulate(
    trace: Trace,
    policy: str = "sync",
    cluster: ClusterConfig | None = None,
    rl: RLConfig | None = None,
    profile: Profile | str | None = None,
    exact: bool = False,
    progress=None,  # noqa: ANN001 - optional callable(step, sim_time)
    tables: bool = True,
    engine_cfg: EngineConfig | None = None,
    iteration_times=None,  # noqa: ANN001 - per instance [(seconds, decode requests, prefill tokens)]
    lockstep: bool = False,
    lengths_sent: bool = False,
    tools=None,  # noqa: ANN001 - rlsim.driver.turns.ToolConfig of a multi-turn trace
    engine: str | None = None,
) -> Result:
    """Simulate `policy` on `trace`; see `rlsim.config` for the knobs and their defaults.
    `tables=False` skips building the per-request table (a summary-only run, as in compare).
    `iteration_times` replays a real run's measured iteration times and `lockstep` drives the
    instances as `rlsim run --real` drives its engines (`rlsim.sim.engine`); `lengths_sent`: as a
    replay-mode real run sent its requests, each with its length as its max tokens (what SGLang's
    rules read; `SimEngine`). `engine` picks the
    implementation, with the same results: "compiled" (`rlsim.sim.compiled`, the default) or
    "simpy" (`SimEngine`, the reference; also what replay runs on), default from `RLSIM_ENGINE`."""
    cluster = cluster or ClusterConfig()
    rl = rl or RLConfig()
    prof = check_setup(trace, cluster, rl, profile, engine_cfg)
    n = cluster.num_instances(prof.instance_gpus)
    parsed = parse_policy(policy)
    spec = None if parsed.histospec is None else SpecModel(parsed.histospec, prof, trace, rl.samples_per_prompt)
    impl = engine or os.environ.get("RLSIM_ENGINE") or "compiled"
    if impl not in ("compiled", "simpy"):
        raise RlsimError(f"unknown engine {impl!r}: use compiled or simpy")
    if not compiled_covers(prof, lockstep, lengths_sent):
        impl = "simpy"
    if impl == "compiled" and iteration_times is None:
        # imported here: numba's llvmlite, once imported, breaks vLLM's kernel scan when a real run
        # starts its engines in this process (`vllm.triton_utils.dispatcher`), so real mode never
        # imports it unless it simulates
        from rlsim.sim.compiled.sim_engine import CompiledEngine

        engine = CompiledEngine(prof, n, exact=exact, spec=spec, lockstep=lockstep)
    else:
        engine = SimEngine(
            prof, n, exact=exact, spec=spec, iteration_times=iteration_times, lockstep=lockstep,
            lengths_sent=lengths_sent,
        )  # fmt: skip
    pol = make_policy(policy)
    t0 = time.perf_counter()
    # The loop allocates millions of small objects that live until the run ends; the cyclic
    # garbage collector rescanning them costs about a fifth of the run, and the loop makes no
    # cycles worth collecting early, so it is paused for the loop.
    gc_enabled = gc.isenabled()
    gc.disable()
    try:
        records = run_loop(
            engine, pol, trace, prof, cluster, rl, progress, dynamic_sampling=parsed.dynamic_sampling, tools=tools,
        )  # fmt: skip
    finally:
        if gc_enabled:
            gc.enable()
    wall = time.perf_counter() - t0
    steps = records.steps_frame()
    requests = records.requests_frame() if tables else pd.DataFrame()
    summary = summarize(steps, records.cols, n, cluster.num_gpus)
    summary["sim_wall_s"] = wall
    summary["reused_samples"] = records.reused_samples
    summary["prefix_hit_tokens"] = engine.prefix_hit_tokens
    summary["wake_reprefill_tokens"] = engine.wake_reprefill_tokens
    summary["pause_interrupts"] = engine.pause_interrupts
    if not rollout_engine(prof.engine.rollout_engine).default:  # (the default's rules leave the summary as it was)
        own = records.engine_aborts()
        if own:  # requests the engine aborted of its own accord (SGLang: a prompt its KV pool cannot hold)
            summary["engine_aborts"] = own
        summary["scheduler"] = scheduler_name(prof.engine, "simpy" if isinstance(engine, SimEngine) else "compiled")
    if records.multi_turn is not None:
        summary["multi_turn"] = records.multi_turn
    if iteration_times is not None:
        summary["replay"] = dict(engine.replay)
    if prof.data_parallel_size > 1:
        summary["data_parallel"] = {"size": prof.data_parallel_size, **engine.dp_counts}
    if spec is not None:
        summary["histospec"] = {"source": spec.source, "acceptance_prob": spec.acceptance_prob}
    config = config_dict(cluster, rl, prof.engine) | {
        "policy": policy, "policy_knobs": getattr(pol, "config", None) and dataclasses.asdict(pol.config),
        "histospec": parsed.histospec and dataclasses.asdict(parsed.histospec), "exact": exact,
        "dynamic_sampling": parsed.dynamic_sampling and dataclasses.asdict(parsed.dynamic_sampling),
        "profile": prof.to_dict(), "async_scheduling": prof.engine.async_scheduling,
        "trace": {"source": trace.meta.source, "model": trace.meta.model},
    }  # fmt: skip
    return Result(policy, config, requests, steps, summary, [engine.segments(i) for i in range(n)])
