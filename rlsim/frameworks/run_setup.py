"""`RunSetup`: what a framework's config says about a run, in rlsim's terms.

A reader (`rlsim.frameworks.verl`) fills one from a config; the commands that simulate take its
options (`options()`, by the names of their own command-line options) and refuse an option the
user also gave on the command line. What a config does not hold (the GPU, the lengths, a model
the config names only by a local path) comes from the command line as before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rlsim.config import EngineConfig
from rlsim.derive.train import Trainer

# what a veRL config states of the engine
ENGINE_KEYS = ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching",
               "free_cache_engine", "enable_chunked_prefill", "enforce_eager", "rollout_engine")  # fmt: skip


@dataclass(frozen=True, slots=True)
class RunSetup:
    """One run's cluster, rollout engine, trainer, batch and mode, as its config states them."""

    framework: str  # "verl"
    source: str  # the config it was read from
    model: str | None  # a model rlsim knows (`rlsim profile list`), or None: the config names a local path
    model_path: str  # what the config names
    num_gpus: int
    placement: str  # colocated, or disaggregated (a trainer pool of `train_gpus`)
    train_gpus: int
    tp: int
    pp: int
    ep: int
    dp: int
    engine: EngineConfig
    trainer: Trainer
    policy: str  # the config's own mode, as an rlsim policy string
    prompts_per_step: int
    samples_per_prompt: int
    max_response_len: int
    use_kl_loss: bool
    # keys that change cost, set away from the release's defaults, which rlsim does not model
    unmodelled: tuple[str, ...] = field(default=())
    # the `engine` fields the config states (the others stay the command line's or the profile's)
    engine_keys: tuple[str, ...] = ENGINE_KEYS
    # vLLM's own `LLM`-class limits on the run's GPU where the framework sets none (NeMo RL)
    vllm_defaults: bool = False
    # the rollout's weights and KV cache, bf16 or fp8, where the config states them (None: the command line's)
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    # vLLM's max_model_len where the config sets it: each request's response is capped at
    # min(max_response_len, max_model_len less its prompt) (NeMo RL sets it to the whole sequence)
    max_model_len: int | None = None

    def options(self) -> dict[str, object]:
        """The command-line options this setup gives a value, by their parameter names (the
        engine's only where the config sets them)."""
        out: dict[str, object] = {
            "gpus": self.num_gpus, "placement": self.placement, "train_gpus": self.train_gpus, "tp": self.tp,
            "pp": self.pp, "ep": self.ep, "dp": self.dp, "trainer": self.trainer.text(),
            "prompts_per_step": self.prompts_per_step, "samples_per_prompt": self.samples_per_prompt,
            "max_response_len": self.max_response_len, "use_kl_loss": self.use_kl_loss,
        }  # fmt: skip
        if self.dtype is not None:
            out["dtype"] = self.dtype
        if self.max_model_len is not None:
            out["max_model_len"] = self.max_model_len
        return out

    def engine_for(self, gpu_memory_bytes: float, gpu_name: str) -> EngineConfig:
        """The engine settings the config states, with vLLM's `LLM`-class limits on this GPU
        where the framework leaves them to vLLM (vllm/engine/arg_utils.py, `_set_default_args`); an
        SGLang rollout keeps SGLang's own rules' defaults (its limits are not vLLM's)."""
        if not self.vllm_defaults or self.engine.rollout_engine != "vllm":
            return self.engine
        big = gpu_memory_bytes >= 70 * 2**30 and "a100" not in gpu_name.lower()
        return dataclasses.replace(  # what the config passes vLLM itself (NeMo RL's vllm_kwargs) stands
            self.engine,
            max_num_seqs=self.engine.max_num_seqs or (1024 if big else 256),
            max_num_batched_tokens=self.engine.max_num_batched_tokens or (16384 if big else 8192),
        )

    def describe(self) -> str:
        """One line: what was read."""
        where = f"{self.num_gpus} GPUs, {self.placement}" + (
            f" ({self.train_gpus} training)" if self.placement == "disaggregated" else ""
        )
        others = (("PP", self.pp), ("EP", self.ep), ("DP", self.dp))
        layout = f"TP {self.tp}" + "".join(f", {k} {v}" for k, v in others if v > 1)
        return (
            f"{self.framework} config {self.source}: {self.model or self.model_path}, {where}, "
            f"{self.engine.rollout_engine} at {layout}, trainer {self.trainer.text()}, "
            f"{self.prompts_per_step} prompts x {self.samples_per_prompt}, responses up to "
            f"{self.max_response_len:,}"
            + (f" (and max_model_len {self.max_model_len:,} less the prompt)" if self.max_model_len else "")
            + f", policy {self.policy}"
        )
