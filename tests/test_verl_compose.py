"""veRL's configs composed by Hydra itself (rlsim.frameworks.verl.compose): the vendored config
tree (`rlsim/frameworks/verl_v0.7.0/`) composes, as veRL's entry points compose it, to the
flattened configs veRL generates from it (`_generated_*.yaml`) and, for the two async recipes, to
their own keys laid over those; overrides go through Hydra's own grammar, so what Hydra refuses is
refused here in one sentence naming the override."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from rlsim.errors import RlsimError
from rlsim.frameworks.verl import CONFIG_DIRS, compose, read_config, read_verl

TREE = Path(__file__).resolve().parents[1] / "rlsim" / "frameworks" / "verl_v0.7.0"
TRAINER = TREE / "verl" / "trainer" / "config"


def _flattened(name: str) -> dict:
    """The config as the reader used to take it: veRL's generated flat file, or for a recipe its own
    keys merged over its base's generated file (its `defaults:` list's first entry)."""
    if name in ("ppo_trainer", "ppo_megatron_trainer"):
        return yaml.safe_load((TRAINER / f"_generated_{name}.yaml").read_text())
    own = yaml.safe_load((TREE / CONFIG_DIRS[name] / f"{name}.yaml").read_text())
    base = own.pop("defaults")[0]
    own.pop("hydra")
    return OmegaConf.to_container(OmegaConf.merge(_flattened(base), own), resolve=False)


@pytest.mark.parametrize("name", list(CONFIG_DIRS))
def test_hydra_composes_each_config_to_the_flattened_file(name: str) -> None:
    composed = OmegaConf.to_container(compose(name), resolve=False)
    assert composed == _flattened(name)
    assert len(composed["actor_rollout_ref"]["rollout"]) > 40  # the whole rollout section, not a stub


def test_a_config_group_override_swaps_a_group_as_hydra_does(tmp_path: Path) -> None:
    """`actor@actor_rollout_ref.actor=megatron_actor` (a config-group override the flattened files
    could not express) picks Megatron's actor defaults, as Hydra composes them."""
    path = tmp_path / "run.overrides"
    path.write_text("actor@actor_rollout_ref.actor=megatron_actor actor_rollout_ref.rollout.name=vllm\n")
    cfg, _ = read_config(path)
    assert cfg["actor_rollout_ref"]["actor"]["strategy"] == "megatron"
    assert "megatron" in cfg["actor_rollout_ref"]["actor"]


@pytest.mark.parametrize(
    ("word", "message"),
    [
        ("data.train_files=~/data/train.parquet", "is not an override Hydra parses"),  # a ~ Hydra's lexer refuses
        ("data.train_batch_size=[1", "is not an override Hydra parses"),
        ("data.train_batch_size=1,2", "a comma makes a Hydra sweep"),
        ("actor@actor_rollout_ref.actor=nonesuch", "has no config actor/nonesuch"),
    ],
)
def test_what_hydras_grammar_refuses_is_one_sentence_naming_it(tmp_path: Path, word: str, message: str) -> None:
    path = tmp_path / "run.overrides"
    path.write_text(f"actor_rollout_ref.rollout.name=vllm {word}\n")
    with pytest.raises(RlsimError, match=message) as err:
        read_config(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_a_yaml_with_a_recipes_defaults_list_is_composed_as_its_overrides(tmp_path: Path) -> None:
    """A partial YAML whose `defaults:` list names veRL's fully-async recipe (its keys merged in
    struct mode over the recipe as Hydra composes it) is the setup the same keys give as overrides;
    a defaults list with a config group's choice in it is refused, naming the override to write."""
    keys = {"actor_rollout_ref.rollout.name": "vllm", "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
            "async_training.require_batches": 2, "rollout.n_gpus_per_node": 4}  # fmt: skip
    over = tmp_path / "run.overrides"
    over.write_text("--config-name=fully_async_ppo_trainer " + " ".join(f"{k}={v}" for k, v in keys.items()) + "\n")
    nested: dict = {"defaults": ["fully_async_ppo_trainer", "_self_"]}
    for k, v in keys.items():
        node = nested
        *parents, leaf = k.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    partial = tmp_path / "mine.yaml"
    partial.write_text(yaml.safe_dump(nested))
    a, b = read_verl(over), read_verl(partial)
    assert a.policy.startswith("fully_async(") and "require_batches=2" in a.policy
    assert dataclasses.replace(a, source="") == dataclasses.replace(b, source="")
    group = {"actor@actor_rollout_ref.actor": "megatron_actor"}
    partial.write_text(yaml.safe_dump({"defaults": ["ppo_trainer", group]}))
    with pytest.raises(RlsimError, match=r"as an override \(actor@actor_rollout_ref.actor=\.\.\.\)"):
        read_config(partial)
