"""The iteration model's terms (TP all-reduce, per-sequence, framework, attention at an achievable
bandwidth, the compute knee) against the layer-by-layer reference, the shipped profiles against
their derivation, profile schema versions, and load-time roofline checks."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibrate.derive_profiles import H100, H800, SHIPPED, derive, h200_llama_8b, terms_for
from rlsim.cli.app import app
from rlsim.errors import RlsimError
from rlsim.iteration_model import closed_form, reference_iteration_s
from rlsim.profile import PROFILE_DIR, load_profile, profile_from_dict
from rlsim.roofline import ProfileWarning, grid

from .conftest import run_python

VIDUR = Path(__file__).resolve().parents[2] / "shared" / "data" / "vidur_profiling"
needs_vidur = pytest.mark.skipif(not VIDUR.exists(), reason="../shared/data/vidur_profiling not beside the checkout")


@needs_vidur
@pytest.mark.parametrize(("gpu", "model", "tp"), SHIPPED, ids=lambda v: getattr(v, "name", v))
def test_closed_form_equals_the_layer_by_layer_reference(gpu, model, tp) -> None:  # noqa: ANN001
    """What the simulator charges (five coefficients + the knee) is the sum over layers of every
    term, at decode, at speculative verification past the compute knee, and with prefill."""
    terms, _ = terms_for(gpu, model, tp, VIDUR)
    prof = load_profile(f"{gpu.name.split('-')[0].lower()}-{model}-tp{tp}")
    knee = terms.linear_t0_s / (terms.linear_prefill_s_per_token - terms.linear_s_per_token)
    assert 100 < knee < 10_000  # the knee sits inside the grid below
    cases = [(1, 1_000, 1, 0), (64, 64 * 8_192, 64, 0), (256, 256 * 4_096, 256 * 8, 0), (32, 32 * 2_048, 32, 2_048),
             (512, 512 * 1_024, 512 * 6, 512), (8, 8 * 30_000, 8, 0)]  # fmt: skip
    for b, c, n_dec, n_pre in cases:
        want = reference_iteration_s(terms, b, c, n_dec, n_pre)
        got = prof.iteration_s(b, c, n_dec, n_pre) + prof.compute_excess_s(n_dec)
        assert got == pytest.approx(want, rel=1e-6), (b, c, n_dec, n_pre)
    n = int(2 * knee)  # past the knee, 256 more tokens cost the compute-bound rate
    past = reference_iteration_s(terms, 256, 0, n + 256) - reference_iteration_s(terms, 256, 0, n)
    assert past == pytest.approx(256 * (terms.linear_prefill_s_per_token + terms.allreduce_s_per_token), rel=1e-9)


@needs_vidur
def test_tensor_parallel_all_reduce_is_charged_per_layer_and_link() -> None:
    """Two all-reduces per layer at TP > 1: 35 us each plus the ring's bytes over NVLink; the
    H800's 400 GB/s link costs more per token than the H100's 900 GB/s, and TP 1 pays none."""
    t1, _ = terms_for(H100, "qwen2.5-7b", 1, VIDUR)
    h100, _ = terms_for(H100, "qwen2.5-32b", 4, VIDUR)
    h800, _ = terms_for(H800, "qwen2.5-32b", 4, VIDUR)
    assert t1.allreduce_calls == 0 and t1.allreduce_s_per_token == 0
    assert h100.allreduce_calls == 128
    # 5,120 hidden x 2 bytes x 2 x 3/4 per call over 900 GB/s, 128 calls
    assert h100.allreduce_s_per_token == pytest.approx(128 * 5120 * 2 * 1.5 / 900e9)
    assert h800.allreduce_s_per_token == pytest.approx(h100.allreduce_s_per_token * 900 / 400)
    assert closed_form(h100)["t_w_s"] - closed_form(t1)["t_w_s"] > 128 * 35e-6 * 0.99


@needs_vidur
def test_shipped_profiles_are_their_derivation() -> None:
    """Each shipped GPU profile is what `python -m calibrate.derive_profiles` writes today."""
    for gpu, model, tp in SHIPPED:
        prof = derive(gpu, model, tp, VIDUR)
        assert json.loads((PROFILE_DIR / f"{prof['name']}.json").read_text()) == prof, prof["name"]
    assert json.loads((PROFILE_DIR / "h200-llama-8b.json").read_text()) == h200_llama_8b()


def test_no_shipped_gpu_profile_exceeds_75_percent_of_the_roofline_where_kv_fits() -> None:
    for name in ("h100-qwen2.5-7b-tp1", "h100-qwen2.5-14b-tp2", "h100-qwen2.5-32b-tp2", "h100-qwen2.5-32b-tp4",
                 "h800-qwen2.5-7b-tp1", "h800-qwen2.5-14b-tp2", "h800-qwen2.5-32b-tp4", "h200-llama-8b"):  # fmt: skip
        cells = [c for c in grid(load_profile(name)) if c.kv_fits]
        assert cells and max(c.roofline_fraction for c in cells) <= 0.75, name


def _raw(name: str = "h100-qwen2.5-14b-tp2") -> dict:
    return json.loads((PROFILE_DIR / f"{name}.json").read_text())


def test_a_schema_1_profile_loads_through_the_migration(tmp_path: Path) -> None:
    """A profile written before schema 2 (no version, no linear_t0_s) loads; its knee is measured
    from t_w as before."""
    raw = _raw()
    del raw["schema_version"], raw["linear_t0_s"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(raw))
    old, new = load_profile(path), load_profile("h100-qwen2.5-14b-tp2")
    assert old.schema_version == 2 and old.linear_t0_s is None
    assert old.iteration_s(64, 64 * 1024, 64) == new.iteration_s(64, 64 * 1024, 64)
    tokens = 4096
    assert old.compute_excess_s(tokens) == max(0.0, (old.prefill_s_per_token - old.gamma_s) * tokens - old.t_w_s)
    assert new.compute_excess_s(tokens) > old.compute_excess_s(tokens)


@pytest.mark.parametrize(
    ("value", "message"),
    [(3, "is profile schema 3; this rlsim reads schemas 1-2 (upgrade rlsim)"),
     ("2", "field 'schema_version' must be a positive integer"), (0, "must be a positive integer")],
)  # fmt: skip
def test_unknown_schema_versions_are_one_sentence(tmp_path: Path, value, message) -> None:  # noqa: ANN001
    raw = _raw() | {"schema_version": value}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(RlsimError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_profile(path)
    with pytest.raises(RlsimError, match="field 'linear_t0_s' must be a finite number >= 0"):
        profile_from_dict(_raw() | {"linear_t0_s": -1.0})


def test_a_profile_faster_than_the_roofline_is_refused_and_one_close_to_it_warns(tmp_path: Path) -> None:
    """At batch 256 x 1k context Qwen2.5-14B at TP 2 must move 14.7 GB + 25.8 GB per rank: 12.1 ms
    at 3.35 TB/s. A profile that decodes that cell in 10.6 ms is refused; one whose closest cell
    is at 89% of the bound (KV read at 89% of the bandwidth) warns."""
    raw = _raw() | {"kv_capacity_tokens": 10**7, "alpha_s": 0.0, "gamma_s": 0.0}
    fast, close = tmp_path / "fast.json", tmp_path / "close.json"
    fast.write_text(json.dumps(raw | {"t_w_s": 3e-3, "beta_s": 2.9e-8}))
    close.write_text(json.dumps(raw | {"t_w_s": 8e-3, "beta_s": 3.3e-8}))
    with pytest.raises(RlsimError, match="below the memory roofline .* a constant is wrong"):
        load_profile(fast)
    with pytest.warns(ProfileWarning, match="of the memory roofline"):
        load_profile(close)
    shown = run_python("-m", "rlsim.cli", "profile", "show", str(close))
    assert shown.stderr.startswith(f"warning: {close}: at batch") and "check its constants" in shown.stderr
    r = CliRunner().invoke(app, ["profile", "show", str(fast)])
    assert r.exit_code == 2 and "\n" not in r.stderr.strip() and "Traceback" not in r.output
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("h100-qwen2.5-32b-tp4", "h800-qwen2.5-14b-tp2", "h200-llama-8b"):
            load_profile(name)  # shipped profiles load without a warning
    raw_cpu = _raw() | {"t_w_s": 1e-6, "beta_s": 0.0, "gpu_facts": {}}
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps(raw_cpu))
    load_profile(cpu)  # no HBM bandwidth stated: exempt
