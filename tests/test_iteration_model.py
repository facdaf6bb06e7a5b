"""The shipped profiles against the derivation that writes them (`rlsim profile derive`): the
closed form the simulator charges against the term-by-term iteration, the TP all-reduce, profile
schema versions, and load-time roofline checks."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.derive.derive import ALLREDUCE_LATENCY_S, _links_s, iteration_s, setup
from rlsim.errors import RlsimError
from rlsim.package_data.profiles import SHIPPED, derive, h200_llama_8b, stale
from rlsim.package_data.profiles import same as _same
from rlsim.profile import PROFILE_DIR, load_profile, profile_from_dict
from rlsim.roofline import ProfileWarning, grid

from .conftest import run_python


@pytest.mark.parametrize(("gpu", "model", "tp"), SHIPPED)
def test_the_closed_form_follows_the_term_by_term_iteration(gpu: str, model: str, tp: int) -> None:
    """What the simulator charges (five coefficients and the compute knee) against the sum of
    every term, at decode, at speculative verification past the knee and with prefill: within 12%
    on every case and within the profile's recorded closed-form error on average (the linear
    layers' roofline is smooth at its knee; the closed form is a line with a hinge)."""
    s = setup(model, gpu, tp)
    prof = load_profile(f"{gpu}-{model}-tp{tp}")
    cases = [(1, 1_000, 1, 0), (64, 64 * 8_192, 64, 0), (256, 256 * 4_096, 256 * 8, 0), (32, 32 * 2_048, 32, 2_048),
             (512, 512 * 1_024, 512 * 6, 512), (8, 8 * 30_000, 8, 0), (128, 128 * 4_096, 128, 0)]  # fmt: skip
    errors = []
    for b, c, n_dec, n_pre in cases:
        want = iteration_s(s, b, c, n_dec, n_pre)
        got = prof.iteration_s(b, c, n_dec, n_pre) + prof.compute_excess_s(n_dec)
        errors.append(abs(got / want - 1))
    assert max(errors) < 0.12, errors
    assert prof.fit_error["closed_form_vs_terms_mape"] < 0.05


def test_tensor_parallel_all_reduce_is_charged_per_layer_and_link() -> None:
    """Two all-reduces per layer at TP > 1: 35 us each plus the ring's bytes over the scale-up
    link; the H800's 400 GB/s link costs more per token than the H100's 900 GB/s, and TP 1 pays none."""
    tokens = np.array([1.0, 257.0])
    assert not _links_s(setup("qwen2.5-7b", "h100", 1), tokens).any()
    h100 = _links_s(setup("qwen2.5-32b", "h100", 4), tokens)
    h800 = _links_s(setup("qwen2.5-32b", "h800", 4), tokens)
    per_token = 128 * 5120 * 2 * 1.5 / 900e9  # 128 calls of 5,120 hidden x 2 bytes x 2 x 3/4 over 900 GB/s
    assert h100[0] == pytest.approx(128 * ALLREDUCE_LATENCY_S + per_token)
    assert (h100[1] - h100[0]) / 256 == pytest.approx(per_token)
    assert (h800[1] - h800[0]) / 256 == pytest.approx(per_token * 900 / 400)


def test_shipped_profiles_are_what_the_command_derives(tmp_path: Path) -> None:
    """Each shipped GPU profile is what `rlsim profile derive` writes (and what `python -m
    rlsim.package_data profiles` writes); the slime fit keeps its published coefficients."""
    for gpu, model, tp in SHIPPED:
        prof = derive(gpu, model, tp)
        assert _same(json.loads((PROFILE_DIR / f"{prof['name']}.json").read_text()), prof), prof["name"]
    out = tmp_path / "p.json"
    args = ["profile", "derive", "--model", "qwen2.5-32b", "--gpu", "h800", "--tp", "4", "-o", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert _same(json.loads(out.read_text()), json.loads((PROFILE_DIR / "h800-qwen2.5-32b-tp4.json").read_text()))
    slime = h200_llama_8b()
    assert json.loads((PROFILE_DIR / "h200-llama-8b.json").read_text()) == slime
    published = (slime["t_w_s"], slime["alpha_s"], slime["beta_s"], slime["kv_capacity_tokens"])
    assert published == (5.595e-3, 23.6e-6, 37.6e-9, 789_000)
    assert stale() == []  # (what `python -m rlsim.package_data --check` says of them)


def test_the_profiles_check_finds_a_changed_a_missing_and_an_extra_profile(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """The check can fail: a profile edited, one deleted and one not built are each named."""
    import shutil

    from rlsim.package_data import profiles

    copy = tmp_path / "profiles"
    shutil.copytree(PROFILE_DIR, copy)
    monkeypatch.setattr(profiles, "OUT", copy)
    raw = json.loads((copy / "h100-qwen2.5-7b-tp1.json").read_text())
    (copy / "h100-qwen2.5-7b-tp1.json").write_text(json.dumps(raw | {"alpha_s": raw["alpha_s"] * 1.01}))
    (copy / "h200-llama-8b.json").unlink()
    (copy / "mine.json").write_text("{}")
    assert sorted(profiles.stale()) == ["h100-qwen2.5-7b-tp1.json differs", "h200-llama-8b.json missing",
                                        "mine.json not built"]  # fmt: skip


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
