"""Figures the docs quote in prose, held to the code that gives them (tables are held by
`tests/test_readme_tables.py`): a figure typed by hand drifts as the model moves (a KV capacity
once read 362,396 where `rlsim profile show` printed 360,391)."""

from __future__ import annotations

from pathlib import Path

from rlsim.config import EngineConfig
from rlsim.derive.derive import RESIDUAL_TOKENS
from rlsim.derive.models import load_model
from rlsim.profile import load_profile
from rlsim.step_costs import with_engine

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_kv_capacities_quoted_are_what_the_profile_derives() -> None:
    prof = load_profile("h100-qwen2.5-32b-tp4")
    at08 = with_engine(prof, EngineConfig(gpu_memory_utilization=0.8)).kv_capacity_tokens
    quote = f"{prof.kv_capacity_tokens:,} tokens per Qwen2.5-32B TP 4 instance at 0.5, {at08:,} at 0.8"
    assert quote in " ".join((DOCS / "simulate.md").read_text().split())


def test_the_moe_residual_knots_and_mla_bytes_quoted_are_the_derivations() -> None:
    text = " ".join((DOCS / "calibrate.md").read_text().split())
    assert f"residual at {len(RESIDUAL_TOKENS)} batch sizes" in text
    facts = load_model("deepseek-v3").facts("bf16", "bf16")
    assert f"({facts['kv_bytes_per_token']:,} bytes for DeepSeek-V3 at bf16)" in text


def test_no_page_gives_the_compare_time_but_the_speed_page() -> None:
    """The time of `rlsim compare` is measured in one place (docs/speed.md's table, which the
    README quotes under a test); pages that mention it link there instead of typing a figure."""
    for page in DOCS.glob("*.md"):
        if page.name not in ("speed.md", "changelog.md"):
            assert "about two minutes" not in page.read_text(), page.name
