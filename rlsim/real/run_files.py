"""What a real run writes after every step: steps, requests, iterations, the recorded trace and the
checkpoint (atomically: an interrupted write never leaves a half file), and the training plot.
"""

from __future__ import annotations

import json
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from rlsim.files import atomic_save, atomic_write_bytes, save_figure
from rlsim.real.engine import ITERATION_COLUMNS, RealEngine
from rlsim.real.run_config import ENGINE_COLUMNS
from rlsim.report import write_run_dir
from rlsim.result import Result, summarize
from rlsim.trace.format import Trace, TraceMeta, save

LOAD_COLUMNS = ("host/others_cpus", "host/load_1m")


@dataclass
class RunState:
    """What a checkpoint holds beside the driver."""

    engine_rows: dict[int, dict[str, Any]]  # rid -> vLLM timestamps (+ token ids, reward when free)
    clock: float
    responses: dict  # HistoSpec history: prompt -> epoch -> token ids
    prompt_ids: dict


class RunFiles:
    """`RealRun`'s writing of its directory (a mixin over its state)."""

    def _requests_frame(self, records) -> pd.DataFrame:  # noqa: ANN001
        df = records.requests_frame()
        for col in ENGINE_COLUMNS:
            df[col] = [self.engine_rows.get(r, {}).get(col, np.nan) for r in df["request_id"]]
        if self.answers or self.targets or self.agent is not None:  # a free run scores its own samples
            df["reward"] = [self.engine_rows.get(r, {}).get("reward", np.nan) for r in df["request_id"]]
        return df

    def _write_step(self, drv, engine: RealEngine, trace: Trace) -> pd.DataFrame:  # noqa: ANN001
        """Write every table and the checkpoint after a step; returns the steps table."""
        drv.records.finalize()
        steps = drv.records.steps_frame()
        while len(self.host_load) < len(steps):
            self.host_load.append(self.meter.read())
        steps = self._with_load(steps)
        write_parquet(self.out / "steps.parquet", steps)
        requests = self._requests_frame(drv.records)
        write_parquet(self.out / "requests.parquet", requests)
        self._write_recorded_trace(requests, trace)
        write_parquet(self.out / "iterations.parquet", pd.DataFrame(engine.iterations, columns=ITERATION_COLUMNS))
        if not self._checkpoints(len(steps)):
            return steps
        state = RunState(self.engine_rows, engine.now, engine.responses, engine.prompt_ids)
        blob = pickle.dumps({"driver": drv.snapshot(), "state": state}, protocol=pickle.HIGHEST_PROTOCOL)
        atomic_write_bytes(self.out / "checkpoint.pkl", blob)
        for old in (self.out / "actor").glob("v*") if self.trainer is not None else ():
            if old.name[1:].isdigit() and int(old.name[1:]) < drv.version:  # the checkpoint now points past it
                shutil.rmtree(old, ignore_errors=True)
        return steps

    def _with_load(self, steps: pd.DataFrame) -> pd.DataFrame:
        """The steps table with each step's host load beside it (NaN where not measured)."""
        steps = steps.copy()
        for k in LOAD_COLUMNS:
            vals = [row.get(k, np.nan) for row in self.host_load[: len(steps)]]
            steps[k] = vals + [np.nan] * (len(steps) - len(vals))
        return steps

    def _write_recorded_trace(self, requests: pd.DataFrame, trace: Trace) -> None:
        """Finished samples as an rlsim trace: visits whose first R0 samples all finished."""
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
            if self.answers or self.targets or self.agent is not None:
                table["reward"] = [r.get("reward", np.nan) for r in rows]
            if self.agent is not None:  # a multi-turn task: the turns and tool calls it ran (trace schema 2)
                table["turn_output_tokens"] = [list(r.get("turn_output_tokens") or [n])
                                               for r, n in zip(rows, table["num_output_tokens"], strict=True)]
                table["turn_finish_reason"] = [
                    ["tool"] * (len(t) - 1) + [why]
                    for t, why in zip(table["turn_output_tokens"], table["finish_reason"], strict=True)
                ]
                table["tool_latency_s"] = [list(r.get("tool_latency_s") or []) for r in rows]
                table["tool_append_tokens"] = [list(r.get("tool_append_tokens") or []) for r in rows]
        meta = TraceMeta(
            model=self.real.model,
            max_response_len=self.rl.max_response_len,
            samples_per_prompt=r0,
            source=f"real:{self.out.name}",
            source_params={"lengths": self.real.lengths, "policy": self.policy, "from_trace": str(self.trace_path)},
            output_token_ids="real" if free else None,
            max_model_len=self._context_cap(trace) if self.agent is not None else None,
        )
        save(Trace(table, meta), self.out / "recorded_trace.parquet")

    def _context_cap(self, trace: Trace) -> int:
        """The context cap a multi-turn run's trajectories fit in (a schema-2 trace names it): the
        source trace's, else the one the run set, else the engines' own (facts.json)."""
        cap = trace.meta.max_model_len or self.real.max_model_len
        if cap is None:
            facts = json.loads((self.out / "facts.json").read_text())["instances"]
            cap = min(int(f["max_model_len"]) for f in facts)
        return int(cap)
    def _finish(self, records, engine: RealEngine, facts: list[dict], stats: list[dict]) -> dict[str, Any]:  # noqa: ANN001
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
    try:
        save_figure(fig, path, dpi=110)
    finally:
        plt.close(fig)


def has_column(path: Path, name: str) -> bool:
    try:
        return name in pq.read_schema(path).names
    except Exception:  # noqa: BLE001 - load() names what is wrong with the file
        return False


def write_parquet(path: Path, frame: pd.DataFrame) -> None:
    atomic_save(path, lambda tmp: frame.to_parquet(tmp, compression="zstd", index=False))
