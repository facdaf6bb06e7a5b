"""`rlsim run --real`: the simulator's driver and policy objects against real vLLM engines (or
SGLang's, with `--rollout-engine sglang`: `rlsim.real.sglang_instance`).

The run directory is written as the run goes. At the start: `config.json` (everything needed to
rerun or simulate the run) and `facts.json` (each engine's `num_gpu_blocks`, KV capacity,
scheduler limits, versions). After every step: `steps.parquet` and `requests.parquet` (the
simulator's tables and names, plus vLLM's own per-request timestamps), `recorded_trace.parquet`
(the responses generated, as an rlsim trace) and `checkpoint.pkl` (the driver, the policy object
and the clock; every `save_freq` steps and after the last). Killing a run loses at most the
step in flight; `--resume` continues from the checkpoint on fresh engines, submitting again the
samples that were in flight (from their first token). With `save_freq` N > 1 a resumed run
starts again after the last checkpoint, and the steps recorded since are run again and replace
their rows. At the end: `summary.json`, `timeline.png` and `trace.json` as a simulated run.

`train=grpo` trains for real (`rlsim.real.trainer`): after the policy's `Train`, the trained samples'
tokens go to a torch copy of the model, one GRPO/DAPO update runs, the weights go into every
engine through vLLM's reload path (`VllmInstance.update_weights`), and the actor checkpoint of
each weight version is kept under `actor/v<N>` until the step's records point past it; the
measured phases replace the profile's in `steps.parquet`. Colocated, the update runs in this
process between rollouts; disaggregated, in a trainer process beside the engines, which go on
generating while it updates (`rlsim.real.learn.BesideLearner`), so a policy's local updates
(`fully_async`) and its syncs (`drain`, `interrupt`) run for real. `train=modeled` waits the profile's
training and weight-sync time instead (so step timing is realistic without training), and
`train=none` skips both: the weights then never change.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import pickle
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from policies.registry import make_policy, parse_policy, policy_class
from rlsim.config import ClusterConfig, EngineConfig, RLConfig, config_dict
from rlsim.driver.driver import Driver
from rlsim.driver.loop import run_loop
from rlsim.errors import RlsimError
from rlsim.files import atomic_write_bytes
from rlsim.hostload import LoadMeter
from rlsim.paths import opened_path, stored_path
from rlsim.profile import load_profile
from rlsim.real.backends import PromptSource, start_backend
from rlsim.real.config import RealConfig
from rlsim.real.engine import ITERATION_COLUMNS, RealEngine
from rlsim.real.learn import Learning
from rlsim.real.rewards import answers_for, score
from rlsim.real.run_calibration import RunCalibration
from rlsim.real.run_config import (
    ENGINE_COLUMNS,
    num_instances,
    profile_from,
    read_run_config,
    run_engine_config,
    run_profile,
    run_profile_engine,
)
from rlsim.real.run_files import LOAD_COLUMNS, RunFiles, RunState, has_column
from rlsim.real.trainer import check_weights, require_torch
from rlsim.real.vllm_engine import check_model, is_cpu_build
from rlsim.real.vllm_instance import InstanceConfig
from rlsim.report import to_json
from rlsim.rollout_engines import DEFAULT as ENGINE_DEFAULT
from rlsim.rollout_engines import REGISTRY as ENGINES
from rlsim.rollout_engines import rollout_engine
from rlsim.trace.format import load
from rlsim.trace.tasks import agent_task, length_reward, tool_reward


class RealRun(Learning, RunCalibration, RunFiles):
    """One real run and its directory (`start` a new one or `resume` an interrupted one)."""

    def __init__(self, out: Path, config: dict[str, Any]) -> None:
        self.out = out
        self.config = config
        where = out / "config.json"
        for key in ("ClusterConfig", "RLConfig", "RealConfig", "policy", "trace_path", "profile"):
            if key not in config:
                raise RlsimError(f"{where} lacks '{key}': the run directory is incomplete or not rlsim's")
        try:
            self.cluster = ClusterConfig(**config["ClusterConfig"])
            self.rl = RLConfig(**config["RLConfig"])
            self.engine_cfg = run_engine_config(config)  # before RealConfig: takes an old run's max_num_seqs
            config["EngineConfig"] = dataclasses.asdict(self.engine_cfg)
            self.real = RealConfig(**config["RealConfig"])
        except TypeError as exc:
            raise RlsimError(f"{where} holds a config this rlsim cannot read ({exc})") from None
        self.policy = config["policy"]
        self.trace_path = opened_path(config["trace_path"], out)
        self.n = num_instances(self.cluster, self.real.rollout_tp)
        self.engine_rows: dict[int, dict[str, Any]] = {}
        self.host_load: list[dict[str, float]] = []  # per step: others' CPU use (rlsim.hostload)
        self.meter = None
        self.answers: dict[int, str] = {}
        self.targets: dict[int, int] = {}
        self.agent = None  # a multi-turn task's rules (rlsim.trace.tasks.AgentTask): the engines run its turns
        self.trainer = None
        self.sleeps = False  # train=grpo on GPU engines: vLLM's sleep mode around every update
        self._last_step = 0  # the run's last step (total_steps), which always checkpoints

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        out: Path,
        trace_path: Path,
        policy: str,
        cluster: ClusterConfig,
        rl: RLConfig,
        real: RealConfig,
        profile: str,
        engine_cfg: EngineConfig | None = None,
    ) -> RealRun:
        # Everything checkable is checked before the run directory is touched.
        parsed = parse_policy(policy)
        if getattr(policy_class(parsed.name), "divided_rollout", False):
            raise RlsimError(
                f"{parsed.name} continues responses from their kept tokens (divided rollout), which "
                "real engines do not do yet: simulate it"
            )
        need = getattr(policy_class(parsed.name), "placement", None)
        if need is not None and cluster.placement != need:
            raise RlsimError(f"{parsed.name} runs on a {need} cluster: add --placement {need} --train-gpus N")
        if parsed.dynamic_sampling is not None and real.lengths == "free":
            raise RlsimError(
                "dynamic sampling reads rewards from the trace, so it runs with --lengths replay only "
                "(a free run scores its own samples)"
            )
        if has_column(trace_path, "turn_output_tokens"):
            raise RlsimError(
                f"{trace_path} is a multi-turn trace: its turns replay in the simulator only; a real multi-turn run "
                "lets the model decide its turns (rlsim trace task --task tool-lookup)"
            )
        if real.train == "grpo":
            if real.lengths != "free":
                raise RlsimError("--train grpo learns from the model's own responses: add --lengths free")
            require_torch()
            check_weights(real.model)
        if (out / "config.json").exists():
            raise RlsimError(f"{out} already holds a run; continue it with --resume or choose another --out")
        prof = load_profile(profile)
        num_instances(cluster, real.rollout_tp)
        check_model(real.model)
        engine_cfg = engine_cfg or EngineConfig()
        engine_cfg.check_settings_for_engine()
        rules = rollout_engine(engine_cfg.rollout_engine)
        if parsed.histospec is not None and not rules.speculates:
            raise RlsimError(
                f"HistoSpec drafts inside {' and '.join(e.label for e in ENGINES.values() if e.speculates)} only: run "
                f"speculating policies with --rollout-engine {next(e.name for e in ENGINES.values() if e.speculates)}"
            )
        if engine_cfg.parallel_sampling:  # (a setting only SGLang has: refused under the others' rules)
            raise RlsimError(
                f"--parallel-sampling is simulated only: a real {rules.label} run sends one request per sample, as "
                "veRL, slime and AReaL send them"
            )
        if real.rollout_tp > 1 and not rules.real_tensor_parallel:
            raise RlsimError(
                f"--rollout-tp {real.rollout_tp} under {rules.label} needs one scheduler process per tensor-parallel "
                f"rank, which rlsim's {rules.label} instance does not launch: run {rules.label} at --rollout-tp 1 (one "
                f"instance per GPU), or use --rollout-engine {ENGINE_DEFAULT}"
            )
        rules.real("real_installed")()  # (sglang is imported by the run, whose log takes its lines)
        # vLLM on a CPU has no sleep mode, and a GPU run sleeps only when no engine holds a request
        # (timing_s/rollout_sleep is then measured): the simulation that validates a run keeps the KV.
        engine_cfg = dataclasses.replace(engine_cfg, free_cache_engine=False)
        config = config_dict(cluster, rl, real, engine_cfg) | {
            "mode": "real",
            "policy": policy,
            "trace_path": stored_path(trace_path, out),
            "profile": prof.to_dict(),
            "profile_name": profile,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out / "config.json", to_json(config).encode())
        return cls(out, config)

    @classmethod
    def resume(cls, out: Path, max_steps: int | None = None) -> RealRun:
        config = read_run_config(out, "holds no run to resume")
        run = cls(out, config)  # a config missing keys or of another version: one sentence, before anything changes
        if max_steps is None:
            return run
        config["RLConfig"]["max_steps"] = max_steps
        atomic_write_bytes(out / "config.json", to_json(config).encode())
        return cls(out, config)

    # ---- the run --------------------------------------------------------------------------
    def run(self, progress=None, on_step_row=None, say=None) -> dict[str, Any]:  # noqa: ANN001
        """Drive the engines to the end; `progress(step, now)` as the simulator's,
        `on_step_row(row)` with each finished step's row of steps.parquet (veRL's metric names),
        `say(line)` with what happens outside the steps (the `--calibrate` passes)."""
        rollout_engine(self.engine_cfg.rollout_engine).real("real_require")()
        parsed = parse_policy(self.policy)
        cols = (["prompt_text"] if self.real.lengths == "free" else []) + ["reward", "reward_time_s", "step"]
        cols.append("target_len")  # a built-in task's stated length (rlsim.trace.tasks)
        trace = load(self.trace_path, columns=[c for c in cols if has_column(self.trace_path, c)])
        if self.rl.max_response_len > trace.meta.max_response_len:
            raise RlsimError(
                f"max_response_len={self.rl.max_response_len} exceeds the trace's cap {trace.meta.max_response_len}"
            )
        prof = run_profile_engine(run_profile(profile_from(self.config["profile"]), self.real.train), self.engine_cfg)
        self._last_step = self.total_steps()
        state = self._load_checkpoint()
        say = say or (lambda line: None)
        if self.real.train == "grpo" and self.cluster.placement == "colocated":
            self.sleeps = not is_cpu_build()
            if not self.sleeps:
                say(
                    "vLLM's CPU backend has no sleep mode (it refuses enable_sleep_mode): the engines keep their "
                    "weights and KV through training, and timing_s/rollout_sleep and rollout_wake_up are recorded "
                    "as not measured (NaN)"
                )
        backend, facts = self._start_engines(parsed.histospec is not None)
        if self.real.calibrate and state is None:  # the profile the run uses, measured on its engines
            prof = run_profile_engine(
                run_profile(self._calibrate_before(backend, facts, say), self.real.train), self.engine_cfg
            )
        self._probe("start", backend, facts)  # before a resumed driver submits its in-flight samples again
        texts = None
        if "prompt_text" in trace.table:
            first = trace.table.drop_duplicates("prompt_id")
            texts = dict(zip(first["prompt_id"].astype(int), first["prompt_text"], strict=True))
            self.answers = answers_for(texts)
        if "target_len" in trace.table:  # a built-in task (rlsim.trace.tasks): the reward for the stated length
            first = trace.table.drop_duplicates("prompt_id")
            self.targets = dict(zip(first["prompt_id"].astype(int), first["target_len"].astype(int), strict=True))
        self.agent = agent_task(trace)
        prompts = PromptSource(min(f["vocab_size"] for f in facts), self.rl.seed, texts)
        engine = RealEngine(
            backend, self.n, prompts, self.real.lengths, self.rl.seed, self.real.temperature,
            clock_offset=state.clock if state else 0.0, histospec=parsed.histospec is not None,
            on_finish=self._on_finish, agent=self.agent, tool_latency_s=self.real.tool_latency_s,
            tool_workers=self.real.tool_workers,
        )  # fmt: skip
        driver = None
        if state is not None:
            self.engine_rows = state.engine_rows
            engine.responses, engine.prompt_ids = state.responses, state.prompt_ids
            its = self.out / "iterations.parquet"
            if its.exists():  # keep the iterations recorded before the interruption
                old = pd.read_parquet(its).reindex(columns=list(ITERATION_COLUMNS), fill_value=-1)
                engine.iterations = list(old[old["time"] <= state.clock].itertuples(index=False, name=None))
            driver = Driver.restore(
                state.driver, engine, trace, prof, self.cluster, self.rl, parsed.dynamic_sampling
            )
        if self.real.train == "grpo":
            self._start_trainer(engine, backend, driver.version if driver is not None else 0)

        if driver is not None and (self.out / "steps.parquet").exists():  # the finished steps' loads
            old_steps = pd.read_parquet(self.out / "steps.parquet")
            rows = old_steps.to_dict("records")[: len(driver.records.steps)]
            self.host_load = [{k: float(row.get(k, np.nan)) for k in LOAD_COLUMNS} for row in rows]
        self.meter = LoadMeter()

        def on_step(drv: Driver) -> None:
            steps = self._write_step(drv, engine, trace)
            if on_step_row is not None and len(steps):
                on_step_row(steps.iloc[-1].to_dict())
            if self.real.calibrate:
                self._calibrate_between(engine, backend, facts, len(steps))
            gc.collect()  # between steps, where a collection pause does not land inside a rollout

        # As in calibration, the cyclic collector does not run during a step: its pauses would
        # land on random iterations and time the rollout differently from the profile's.
        gc_was = gc.isenabled()
        gc.disable()
        try:
            records = run_loop(
                engine, make_policy(self.policy), trace, prof, self.cluster, self.rl, progress, driver, on_step,
                parsed.dynamic_sampling,
            )
            stats = [backend.call(i, "stats") for i in range(self.n)]
            self._probe("end", backend, facts)
            if self.real.calibrate:
                self._calibrate_end(backend, facts, len(records.steps), say)
        finally:
            if gc_was:
                gc.enable()
            backend.close()
            if hasattr(self.trainer, "close"):  # a trainer process (disaggregated)
                self.trainer.close()
            if self.trainer is not None:  # the pushed weights sit in memory (/dev/shm): not left behind
                shutil.rmtree(self._weights_dir(), ignore_errors=True)
        return self._finish(records, engine, facts, stats)

    # ---- --train grpo (rlsim.real.trainer) -------------------------------------------------------
    def total_steps(self) -> int:
        """The steps this run will take: --steps, or every epoch of the trace's prompts."""
        if self.rl.max_steps:
            return self.rl.max_steps
        prompts = pq.read_table(self.trace_path, columns=["prompt_id"]).column(0).to_numpy()
        return math.ceil(len(set(prompts.tolist())) / self.rl.prompts_per_step) * self.rl.epochs

    def _start_engines(self, histospec: bool):  # noqa: ANN202
        cfg = InstanceConfig(
            model=self.real.model,
            tensor_parallel_size=self.real.rollout_tp,
            seed=self.rl.seed,
            max_model_len=self.real.max_model_len,
            dtype=self.real.dtype,
            # the run's settings, max_num_seqs defaulting to the profile's (the others to vLLM's)
            engine=dataclasses.replace(
                self.engine_cfg, max_num_seqs=self.engine_cfg.max_num_seqs or self.config["profile"].get("max_num_seqs")
            ),
            histospec_k=self.real.histospec_k if histospec else 0,
            logprobs=self.real.train == "grpo",
            enable_sleep_mode=self.sleeps,
        )
        backend, facts = start_backend(cfg, self.n, self.real.ray_address)
        atomic_write_bytes(self.out / "facts.json", to_json({"instances": facts}).encode())
        return backend, facts

    def _on_finish(self, req, f: dict) -> None:  # noqa: ANN001
        row = {k: f[k] for k in ENGINE_COLUMNS}
        if self.real.lengths == "free":
            row["output_token_ids"] = f["output_token_ids"]
            truth = self.answers.get(req.prompt_id)
            target = self.targets.get(req.prompt_id)
            if "turn_tokens" in f:  # a multi-turn task's trajectory: its turns and tool calls, and its reward
                row |= {k: f[k] for k in ("turn_output_tokens", "tool_latency_s", "tool_append_tokens")}
                row["reward"] = tool_reward(f["turn_tokens"], [t for a in f["tool_answers"] for t in a])
            elif target is not None:
                row["reward"] = length_reward(len(f["output_token_ids"]), target, self.rl.max_response_len)
            elif truth is not None:  # an empty response has no answer line: scored wrong
                row["reward"] = score(f.get("text") or "", truth)
        self.engine_rows[req.request_id] = row

    def _checkpoints(self, step: int) -> bool:
        """Whether the run checkpoints after this step: every `save_freq` steps and the last."""
        return step % self.real.save_freq == 0 or step >= self._last_step

    def _load_checkpoint(self):  # noqa: ANN202
        path = self.out / "checkpoint.pkl"
        if not path.exists():
            return None
        try:
            blob = pickle.loads(path.read_bytes())
            state: RunState = blob["state"]
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign pickle raises many types
            raise RlsimError(
                f"{path} cannot be read ({type(exc).__name__}): the run was cut while checkpointing; delete it to "
                "restart from the last finished step's records, or start a new run"
            ) from None
        state.driver = blob["driver"]
        return state
