"""veRL's published per-phase times against rlsim, each run set up from its stated configuration and
reported as found (never tuned to; no framework term fitted: veRL's setting is the derived one).

    python -m doctables.verl_phases [--markdown | --readme]

The runs are the colocated synchronous baselines of veRL's `fully_async_policy` README
(github.com/volcengine/verl, verl/experimental/fully_async_policy/README.md; H20 GPUs), with the
settings of the scripts beside it (`shell/grpo_30b_a3b_base_math_megatron_96_32.sh`,
`shell/dapo_7b_math_fsdp2_*.sh`), read from their launch overrides (`published_runs/verl/`) by
the reader users run (`--from verl:`, `rlsim.frameworks.verl`):

- Qwen3-30B-A3B-Base, GRPO, 128 GPUs, 512 prompts x 16, responses up to 8K: Megatron TP 2, CP 2,
  EP 8 with parameter, gradient and optimizer offload (`optimizer_offload_fraction` 1), the
  reference's parameters offloaded, dynamic batch size at 10,240 tokens a GPU for every pass, a
  KL loss (the reference's pass); vLLM at TP 4, `gpu_memory_utilization` 0.7,
  `max_num_batched_tokens` 10,240, `enforce_eager`;
- Qwen2.5-Math-7B (Qwen2.5-7B's shape), DAPO, 32, 64 and 128 GPUs, 512 prompts x 16, responses up
  to 28K: FSDP2 with Ulysses sequence parallelism 4, veRL's default gradient checkpointing (full
  recompute), dynamic batch size at 61,440 tokens a GPU (92,160 for log-probs), no KL; vLLM at TP 4,
  `gpu_memory_utilization` 0.8, `max_num_batched_tokens` 30,720.

What a run does not publish is its lengths: each is simulated on the stand-in trace, the DAPO
preset (`dapo-qwen2.5-32b`) at the run's response cap, and its step is also given with every
length 25% shorter and 25% longer (`length_scale` 0.75 and 1.25): the step's sensitivity to the
stand-in. A second table holds the README's weight-sync ablation (Megatron trainer, fully async:
trainer and rollout on separate GPUs, with and without the checkpoint engine's 4,096 MB buckets).
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.derive.derive import derive_profile, setup
from rlsim.derive.train import Trainer
from rlsim.frameworks.verl import read_verl
from rlsim.package_data.bands import VERL_RUNS, VERL_SCRIPTS
from rlsim.package_data.markers import emit
from rlsim.profile import profile_from_dict
from rlsim.sim.simulate import simulate
from rlsim.step_costs import weight_sync_s
from rlsim.trace.synth import SynthConfig, synthesize

PRESET = "dapo-qwen2.5-32b"
STEPS = 3
PHASES = ("gen", "old_log_prob", "ref", "update_actor", "update_weights")


@dataclass(frozen=True)
class Run:
    """One published colocated run: its setup and its per-phase seconds."""

    name: str
    model: str
    gpus: int
    gen_tp: int
    cap: int
    engine: EngineConfig
    trainer: Trainer
    use_kl_loss: bool
    published: dict


# the runs' settings, read from the launch scripts as published (their overrides as bash expands them)
# by the same reader users run (`--from verl:`); the sync baselines ran colocated with them
MOE_SETUP = read_verl(VERL_SCRIPTS / VERL_RUNS["Qwen3-30B-A3B"])
DENSE_SETUP = read_verl(VERL_SCRIPTS / VERL_RUNS["Qwen2.5-Math-7B"])
MOE_TRAINER, DENSE_TRAINER = MOE_SETUP.trainer, DENSE_SETUP.trainer


def _engine(s) -> EngineConfig:  # noqa: ANN001 - rlsim.frameworks.run_setup.RunSetup
    """The script's vLLM settings for the colocated baseline."""
    e = s.engine
    return EngineConfig(
        gpu_memory_utilization=e.gpu_memory_utilization,
        max_num_batched_tokens=e.max_num_batched_tokens,
        enforce_eager=e.enforce_eager or None,
    )


DENSE_ENGINE = _engine(DENSE_SETUP)
RUNS = (
    Run("Qwen3-30B-A3B, 128 H20", MOE_SETUP.model, 128, MOE_SETUP.tp, MOE_SETUP.max_response_len,
        _engine(MOE_SETUP), MOE_TRAINER, MOE_SETUP.use_kl_loss,
        {"step": 497.89, "gen": 348.05, "old_log_prob": 28.73, "ref": 20.86, "update_actor": 86.27}),
    *(Run(f"Qwen2.5-Math-7B, {g} H20", "qwen2.5-7b", g, DENSE_SETUP.tp, DENSE_SETUP.max_response_len,
          DENSE_ENGINE, DENSE_TRAINER, DENSE_SETUP.use_kl_loss, pub)
      for g, pub in ((32, {"step": 790.10, "gen": 357.41, "old_log_prob": 107.71, "update_actor": 269.80}),
                     (64, {"step": 365.28, "gen": 150.72, "old_log_prob": 70.26, "update_actor": 133.41}),
                     (128, {"step": 356.30, "gen": 177.85, "old_log_prob": 53.92, "update_actor": 113.81}))),
)  # fmt: skip
# README, "checkpoint-engine Ablation Experiment": Megatron trainer, H20, total sync seconds
SYNC = (("Qwen2.5-Math-7B", "qwen2.5-7b", 4, 4, 0.12, 0.02), ("Qwen3-30B-A3B", "qwen3-30b-a3b", 16, 16, 15.76, 4.38),
        ("Qwen3-235B-A22B", "qwen3-235b-a22b", 64, 64, 58.57, 23.70))  # fmt: skip
CHECKPOINT_ENGINE_BUCKET = 4096 * 2**20  # device_buffer_size_M, its default


def simulate_run(run: Run, workdir: Path, scale: float = 1.0) -> dict:
    """Mean phases of steps 2-3 of `run` on the stand-in lengths at `length_scale` `scale`."""
    raw = derive_profile(setup(run.model, "h20", run.gen_tp), run.engine, run.trainer)
    path = workdir / f"{raw['name']}.json"
    path.write_text(json.dumps(raw))
    trace = synthesize(SynthConfig(preset=PRESET, num_prompts=512 * STEPS, samples_per_prompt=16, epochs=1,
                                   prompts_per_step=512, max_response_len=run.cap, length_scale=scale))  # fmt: skip
    rl = RLConfig(prompts_per_step=512, samples_per_prompt=16, max_response_len=run.cap, epochs=1, max_steps=STEPS,
                  use_kl_loss=run.use_kl_loss)  # fmt: skip
    res = simulate(trace, "sync", ClusterConfig(num_gpus=run.gpus, profile=str(path)), rl, engine_cfg=run.engine)
    later = res.steps.iloc[1:]
    out = {k: float(later[f"timing_s/{k}"].mean()) for k in PHASES}
    return out | {"step": float(later["timing_s/step"].mean())}


def phase_table() -> str:
    lines = ["| run | phase | published (s) | rlsim (s) | error |", "|---|---|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        for run in RUNS:
            got = simulate_run(run, Path(tmp))
            low, high = (simulate_run(run, Path(tmp), s)["step"] for s in (0.75, 1.25))
            for phase in ("gen", "old_log_prob", "ref", "update_actor", "update_weights", "step"):
                pub = run.published.get(phase)
                if pub is None and phase != "update_weights":
                    continue
                cell = f"{pub:.1f}" if pub is not None else "not published"
                err = f"{got[phase] / pub - 1:+.0%}" if pub else ""
                lines.append(f"| {run.name} | {phase} | {cell} | {got[phase]:.1f} | {err} |")
            lines.append(f"| {run.name} | step, lengths -25% / +25% | | {low:.1f} / {high:.1f} | "
                         f"{low / got['step'] - 1:+.0%} / {high / got['step'] - 1:+.0%} of rlsim's |")  # fmt: skip
    return "\n".join(lines) + "\n"


def sync_table() -> str:
    lines = ["| model | trainer : rollout GPUs | checkpoint engine | published (s) | rlsim (s) | error |",
             "|---|---|---|---:|---:|---:|"]  # fmt: skip
    for name, model, train, roll, plain, engine in SYNC:
        tp = 8 if "235" in model else 4  # the rollout TP its weights need on a 96 GB H20
        raw = derive_profile(setup(model, "h20", tp), EngineConfig(gpu_memory_utilization=0.9), Trainer("megatron"))
        prof = profile_from_dict(raw)
        for label, bucket, pub in (("off", None, plain), ("on (4,096 MB buckets)", CHECKPOINT_ENGINE_BUCKET, engine)):
            got = weight_sync_s(prof, train + roll, bucket)
            lines.append(f"| {name} | {train} : {roll} | {label} | {pub:.2f} | {got:.2f} | {got / pub - 1:+.0%} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    phases, sync = phase_table(), sync_table()
    if "--markdown" in sys.argv or "--readme" in sys.argv:
        emit("verl_phases", phases, sys.argv)
        emit("verl_weight_sync", sync, sys.argv)
    else:
        print(phases + "\n" + sync)
    return 0


if __name__ == "__main__":
    sys.exit(main())
