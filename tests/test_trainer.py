"""rlsim.real.trainer on a tiny random Llama built here (torch and transformers, no vLLM): samples
generated under older weights are trained with their behaviour log-probs, fresh ones with
recomputed ones; the reference model's pass is its own phase."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.optional import need

need("torch", "the trainer runs torch")
need("transformers", "the trainer builds Hugging Face models")

from calibrate.tiny_model import build  # noqa: E402
from rlsim.real.trainer import Sample, Trainer, TrainerConfig  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def _samples(trainer: Trainer, staleness: int, shift: float) -> list[Sample]:
    """Two groups of two; each sample's engine log-probs are the trainer's own minus `shift`
    (a behaviour policy that made these tokens less likely than today's weights do)."""
    base = [Sample(group=i // 2, prompt_token_ids=(5, 6, 7, 8), response_token_ids=tuple(range(10 + i, 30 + i)),
                   reward=float(i % 2)) for i in range(4)]  # fmt: skip
    logp = trainer.log_probs(base)
    return [Sample(s.group, s.prompt_token_ids, s.response_token_ids, s.reward,
                   tuple(x - shift for x in lp), staleness) for s, lp in zip(base, logp, strict=True)]  # fmt: skip


def test_stale_samples_are_trained_with_their_behaviour_log_probs(model: Path) -> None:
    """Behaviour log-probs 0.5 below today's make the ratio e^0.5 = 1.65, past DAPO's clip-high
    1.28 for the positive advantages: clipped only when the samples are stale. Fresh samples are
    recomputed (veRL's default), so their ratio is 1 and nothing clips."""
    fresh = Trainer(str(model), TrainerConfig(lr=1e-9))
    m = fresh.update(_samples(fresh, staleness=0, shift=0.5))
    assert m["training/off_policy_samples"] == 0 and m["actor/pg_clipfrac"] == 0
    assert m["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    stale = Trainer(str(model), TrainerConfig(lr=1e-9))
    m = stale.update(_samples(stale, staleness=1, shift=0.5))
    assert m["training/off_policy_samples"] == 4 and m["actor/pg_clipfrac"] == pytest.approx(0.5)  # 2 of 4 positive
    assert m["actor/ppo_kl"] == pytest.approx(-0.5, abs=1e-4)  # old - new, veRL's sign
    assert m["training/rollout_probs_diff_max"] > 1e-4  # the engine-vs-trainer gap, made here on purpose, is reported


def test_the_reference_pass_is_timed_apart_and_its_kl_starts_at_zero(model: Path) -> None:
    trainer = Trainer(str(model), TrainerConfig(lr=1e-2, use_kl_loss=True))
    first = trainer.update(_samples(trainer, 0, 0.0))
    second = trainer.update(_samples(trainer, 0, 0.0))
    assert first["timing_s/ref"] > 0 and first["actor/kl_loss"] == pytest.approx(0.0, abs=1e-7)
    assert second["actor/kl_loss"] > 0  # the actor moved away from the frozen reference


def test_tool_tokens_masked_off_the_loss_move_nothing(model: Path) -> None:
    """A multi-turn sample's tool tokens are in its context but not in its loss: a batch whose
    every response token is masked leaves the weights as they were, and the same batch unmasked
    moves them (the update reached the model)."""

    def batch(mask: bool) -> list[Sample]:
        return [Sample(group=i // 2, prompt_token_ids=(5, 6, 7, 8), response_token_ids=tuple(range(10 + i, 20 + i)),
                       reward=float(i % 2), loss_mask=(0,) * 10 if mask else None) for i in range(4)]  # fmt: skip

    moved = {}
    for mask in (True, False):
        trainer = Trainer(str(model), TrainerConfig(lr=1e-2, weight_decay=0.0))  # (decay moves every weight)
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.update(batch(mask))
        moved[mask] = max(float((p.detach() - b).abs().max()) for p, b in zip(trainer.model.parameters(), before,
                                                                              strict=True))  # fmt: skip
    assert moved[True] == 0.0 and moved[False] > 1e-4, moved
    assert batch(True)[0].trained() == 0 and batch(False)[0].trained() == 10
