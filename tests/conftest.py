"""Shared fixtures: small traces built with the real generator, and the real PolyTrace logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsim.synth import SynthConfig, synthesize
from rlsim.trace import Trace, save

DATA = Path(__file__).parent / "data"
POLYTRACE_DIR = DATA / "polytrace_verl_dapo_qwen2.5"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def small_trace() -> Trace:
    """A 40-prompt, 4-sample, 2-epoch trace of the default preset."""
    return synthesize(SynthConfig(num_prompts=40, samples_per_prompt=4, epochs=2, seed=7))


@pytest.fixture
def small_trace_path(tmp_path: Path, small_trace: Trace) -> Path:
    return save(small_trace, tmp_path / "small.parquet")
