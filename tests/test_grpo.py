"""`rlsim.real.grpo` against veRL's own numbers (tests/data/verl_golden.json, written by
tests/data/make_verl_golden.py with the veRL version it names), and the trainer's checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.optional import need

torch = need("torch", "torch is installed with the real-mode extras")

from rlsim.errors import RlsimError  # noqa: E402
from rlsim.real import grpo  # noqa: E402

GOLDEN = json.loads((Path(__file__).parent / "data" / "verl_golden.json").read_text())
X = {k: (torch.tensor(v) if k != "index" else v) for k, v in GOLDEN["inputs"].items()}
V = GOLDEN["verl"]


def _close(a: torch.Tensor, b: list | float) -> None:
    assert torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.tensor(b), atol=1e-6, rtol=1e-5), (a, b)


def test_the_golden_values_name_their_verl_version() -> None:
    assert V["verl_version"].count(".") >= 2


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_advantages_are_verls(norm: bool) -> None:
    adv, ret = grpo.compute_grpo_outcome_advantage(
        X["rewards"].unsqueeze(-1) * torch.ones_like(X["response_mask"][:, :1]), torch.ones(6, 1), X["index"],
        norm_adv_by_std_in_grpo=norm,
    )  # fmt: skip
    want = torch.tensor(V[f"grpo_advantages_norm_{norm}"])
    _close(adv[:, 0].unsqueeze(-1) * X["response_mask"], want.tolist())
    assert adv is ret or torch.equal(adv, ret)


@pytest.mark.parametrize("mode", grpo.LOSS_AGG_MODES)
@pytest.mark.parametrize("scope", ["local", "global"])
def test_dapo_policy_loss_is_verls(mode: str, scope: str) -> None:
    info = {"batch_num_tokens": 100, "global_batch_size": 10} if scope == "global" else {}
    loss, clipfrac, ppo_kl, clipfrac_lower = grpo.compute_policy_loss_vanilla(
        X["old_log_prob"], X["log_prob"], X["advantages"], X["response_mask"], mode, 0.2, 0.28, 3.0, **info
    )
    want = V[f"policy_loss_{mode}_{scope}"]
    _close(loss, want["pg_loss"])
    _close(clipfrac, want["pg_clipfrac"])
    _close(ppo_kl, want["ppo_kl"])
    _close(clipfrac_lower, want["pg_clipfrac_lower"])
    assert want["pg_clipfrac"] > 0 and want["pg_clipfrac_lower"] > 0  # the inputs reach both clips


def test_kl_entropy_and_log_probs_are_verls() -> None:
    _close(grpo.kl_penalty(X["log_prob"], X["ref_log_prob"]), V["kl_low_var_kl"])
    _close(grpo.entropy_from_logits(X["logits"]), V["entropy"])
    _close(grpo.logprobs_from_logits(X["logits"], X["labels"]), V["logprobs"])
    _close(grpo.masked_mean(X["advantages"], X["response_mask"]), V["masked_mean"])


def test_trainer_settings_are_checked() -> None:
    from rlsim.real.trainer import TrainerConfig, check_weights

    with pytest.raises(RlsimError, match="learning rate must be positive"):
        TrainerConfig(lr=0.0)
    with pytest.raises(RlsimError, match="old_log_prob"):
        TrainerConfig(old_log_prob="engine")
    with pytest.raises(RlsimError, match="holds no weights"):
        check_weights(str(Path(__file__).parent / "data"))
