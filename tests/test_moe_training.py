"""A mixture-of-experts model trains at Megatron's MFU times its published efficiency against a
dense model (`rlsim.derive.moe_training`, Megatron-Bridge's pre-training throughput), in the
derived default and in NeMo RL's fitted dense MFU alike."""

from __future__ import annotations

import pytest

from rlsim.derive.derive import derive_profile, setup
from rlsim.derive.models import load_model
from rlsim.derive.moe_training import REFERENCE, efficiency_of_row, moe_training_efficiency, published
from rlsim.derive.terms import Terms
from rlsim.derive.train import MEGATRON_MFU, Trainer
from rlsim.errors import RlsimError


def facts(name: str) -> dict:
    return load_model(name).facts("bf16", "bf16")


def test_the_published_moe_models_train_at_a_fraction_of_a_dense_model() -> None:
    """Under rlsim's FLOP count, Megatron-Bridge's H100 rows put Qwen3-30B-A3B's small experts at
    0.15 of LLAMA3_8B, Qwen3-235B-A22B at 0.28 and DeepSeek-V3 at 0.40: the finer the experts, the
    lower; a dense model is 1."""
    eff = {m: moe_training_efficiency(facts(m))[0] for m in ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3")}
    assert eff["qwen3-30b-a3b"] == pytest.approx(0.151, abs=0.005)
    assert eff["qwen3-235b-a22b"] == pytest.approx(0.285, abs=0.005)
    assert eff["deepseek-v3"] == pytest.approx(0.398, abs=0.005)
    assert moe_training_efficiency(facts("qwen3-32b")) == (1.0, "a dense model")


def test_every_source_row_has_its_dense_reference_and_the_tests_say_how_far_it_carries() -> None:
    """Each MoE row is read against LLAMA3_8B of the same release, system and precision; the
    checks, never used: LLAMA3_70B (dense) at 0.93 of the reference, and on GB200 the MoE models
    train at about twice their H100 efficiency (Qwen3-30B-A3B 0.33, DeepSeek-V3 0.58)."""
    d = published()
    others = d[d.model != REFERENCE]
    assert (others.role == "source").sum() == 3 and set(d.role) == {"source", "test"}
    found = {(d.loc[i, "system"], d.loc[i, "rlsim_model"]): efficiency_of_row(d, i) for i in others.index}
    assert found[("DGX-H100", "llama-3.1-70b")] == pytest.approx(0.93, abs=0.01)
    assert found[("DGX-GB200", "qwen3-30b-a3b")] == pytest.approx(0.33, abs=0.01)
    assert found[("DGX-GB200", "deepseek-v3")] == pytest.approx(0.58, abs=0.01)


def test_an_unpublished_moe_model_takes_the_nearest_expert_gemm_and_says_so() -> None:
    """Moonlight-16B-A3B (64 experts of 1,408, hidden 2,048) has no published row: its expert GEMM
    is nearest Qwen3-30B-A3B's (768 x 2,048), whose efficiency it takes, named in its source."""
    eff, where = moe_training_efficiency(facts("moonlight-16b-a3b"))
    assert eff == moe_training_efficiency(facts("qwen3-30b-a3b"))[0]
    assert where.startswith("no published row") and "Qwen3_30B_a3B" in where


def test_the_derived_megatron_default_and_the_dense_term_scale_an_moe_model_only() -> None:
    """A Megatron trainer with no MFU given trains Qwen3-30B-A3B at 47% x 0.15 and says so in the
    profile's provenance; a given MFU is taken as it is; NeMo RL's dense MFU term lays the same
    efficiency over it, and a dense model takes the term unchanged."""
    moe = derive_profile(setup("qwen3-30b-a3b", "h100", 2), trainer=Trainer("megatron", ep=8))
    eff, _ = moe_training_efficiency(moe["model_facts"])
    assert moe["train"]["mfu"] == pytest.approx(MEGATRON_MFU * eff)
    assert "published efficiency against a dense one" in moe["provenance"]["train"]
    given = derive_profile(setup("qwen3-30b-a3b", "h100", 2), trainer=Trainer("megatron", ep=8, mfu=0.3))
    assert given["train"]["mfu"] == 0.3 and "given" in given["provenance"]["train"]
    assert Terms(megatron_dense_mfu=0.5).apply(moe)["train"]["mfu"] == pytest.approx(0.5 * eff, rel=1e-5)
    dense = derive_profile(setup("qwen3-32b", "h100", 4), trainer=Trainer("megatron", tp=4))
    assert dense["train"]["mfu"] == MEGATRON_MFU
    assert Terms(megatron_dense_mfu=0.5).apply(dense)["train"]["mfu"] == 0.5
    assert Terms(megatron_mfu=0.5).apply(moe)["train"]["mfu"] == 0.5  # the older term: every model alike
    with pytest.raises(RlsimError, match="not both"):
        Terms(megatron_dense_mfu=0.5, megatron_mfu=0.5)
    with pytest.raises(RlsimError, match="megatron_dense_mfu must be in"):
        Terms(megatron_dense_mfu=0.0)


def test_model_facts_that_name_experts_without_their_size_are_refused_in_one_sentence() -> None:
    bare = {k: v for k, v in facts("qwen3-30b-a3b").items() if k != "expert_params"}
    with pytest.raises(RlsimError, match="name 128 experts but not 'expert_params'"):
        moe_training_efficiency(bare)
