"""The memory roofline against hand-worked numbers, `rlsim profile show`, and profile loading
that refuses non-finite numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.errors import RlsimError
from rlsim.model_facts import kv_bytes_per_token
from rlsim.profile import PROFILE_DIR, load_profile, shipped_profiles
from rlsim.roofline import cell, grid, has_roofline, roofline_s


def test_roofline_matches_hand_worked_numbers_for_qwen25_14b_tp2() -> None:
    """Qwen2.5-14B (48 layers, 8 KV heads of 128, bf16, 14.77e9 parameters counted from its
    config) at TP 2 on H100: KV 2 x 48 x 8 x 128 x 2 = 196,608 bytes per token; batch 32 x 16,384
    context per rank reads 14.77e9 x 2 / 2 = 14.77 GB of weights and 32 x 16,384 x 196,608 / 2 =
    51.54 GB of KV: 66.31 GB / 3.35 TB/s = 19.79 ms. The profile's iteration there is
    10.6307 ms + 23.6 us x 32 + 40.406 ns x 524,288 + 18.995 us x 32 = 33.18 ms, so it runs at
    60% of the roofline."""
    p = load_profile("h100-qwen2.5-14b-tp2")
    assert kv_bytes_per_token(p.model_facts) == 196_608
    assert p.model_facts["num_params"] == 14_769_192_960
    assert roofline_s(p, 32, 16_384) == pytest.approx((14_769_192_960 + 32 * 16_384 * 98_304) / 3.35e12)
    assert roofline_s(p, 32, 16_384) == pytest.approx(0.019794, rel=1e-4)
    c = cell(p, 32, 16_384)
    assert c.iteration_s == pytest.approx(0.0106306599 + 2.36e-05 * 32 + 4.04059701e-08 * 524_288 + 1.89945748e-05 * 32)
    assert c.roofline_fraction == pytest.approx(0.5966, abs=1e-3)
    assert not c.kv_fits  # 524,288 tokens > the profile's 256,661
    assert cell(p, 32, 4096).kv_fits


def test_every_shipped_gpu_profile_is_below_the_roofline() -> None:
    """No shipped GPU profile is faster than physics anywhere on the grid."""
    for name in shipped_profiles():
        p = load_profile(name)
        if has_roofline(p):
            assert max(c.roofline_fraction for c in grid(p)) < 1.0, name


def test_profile_show_prints_the_grid_and_marks_cells_where_kv_does_not_fit() -> None:
    r = CliRunner().invoke(app, ["profile", "show", "h100-qwen2.5-14b-tp2"])
    assert r.exit_code == 0, r.output
    assert "964 (60%) *" in r.output and "1,851 (48%)" in r.output
    r = CliRunner().invoke(app, ["profile", "show", "h100-qwen2.5-14b-tp2", "--json"])
    cells = json.loads(r.output)["cells"]
    assert len(cells) == 16 and {c["batch"] for c in cells} == {32, 64, 128, 256}
    r = CliRunner().invoke(app, ["profile", "list"])
    assert r.exit_code == 0 and "h200-llama-8b" in r.output
    bad = CliRunner().invoke(app, ["profile", "show", "no-such-profile"])
    assert bad.exit_code == 2 and "unknown profile" in bad.stderr


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("beta_s", "NaN", "field 'beta_s' must be a finite number"),
        ("t_w_s", -1.0, "t_w_s must be >= 0"),
        ("gpu_facts", {"hbm_bytes_per_s": -3.0}, "field 'gpu_facts.hbm_bytes_per_s' must be a finite number >= 0"),
        ("train", {"flops_per_token": 1.0, "peak_flops_per_gpu": "Infinity", "mfu": 0.3, "fixed_s": 1.0},
         "field 'train.peak_flops_per_gpu' must be a finite number"),
    ],
)  # fmt: skip
def test_profile_loading_refuses_bad_numbers_in_one_sentence(tmp_path: Path, field, value, message) -> None:  # noqa: ANN001
    raw = json.loads((PROFILE_DIR / "h100-qwen2.5-14b-tp2.json").read_text())
    raw[field] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity"))
    with pytest.raises(RlsimError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_profile(path)
    r = CliRunner().invoke(app, ["profile", "show", str(path)])
    assert r.exit_code == 2 and "\n" not in r.stderr.strip()


@pytest.mark.parametrize("field", ["beta_s", "kv_capacity_tokens", "train"])
def test_profile_loading_refuses_a_missing_field_in_one_sentence(tmp_path: Path, field: str) -> None:
    raw = json.loads((PROFILE_DIR / "h100-qwen2.5-14b-tp2.json").read_text())
    del raw[field]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(RlsimError, match=f"is missing field '{field}'"):
        load_profile(path)
    r = CliRunner().invoke(app, ["profile", "show", str(path)])
    assert r.exit_code == 2 and "\n" not in r.stderr.strip()
