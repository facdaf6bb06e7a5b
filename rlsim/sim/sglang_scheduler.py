"""SGLangScheduler: SGLang's scheduling rules for one rollout instance, iteration by iteration.

A port of what sglang 0.5.23's `Scheduler` (`sglang/srt/managers/scheduler.py`) decides for a
plain decoder with its defaults (schedule policy `fcfs`, page size 1, mixed chunks off, overlap
scheduler on) and the settings users change (`page_size`, `SGLangSettings`: the conservativeness
and SGLang's ratio variables), time left out (`rlsim.sim.engine` prices iterations). Each rule, and
where it is:

- **Prefill first** (`get_next_batch_to_run`): a prefill batch, when one can be formed, runs on
  its own; the running requests decode only in iterations without one.
- **Admission** (`_get_new_batch_prefill_raw`, `PrefillAdder.add_one_req` in
  `schedule_policy.py`, `PrefillBudget` in `mem_cache/prefill_budget.py`): waiting requests in
  order, each matched against the radix cache, while fewer than `max_running_requests` run and
  the pass has input budget (`max_prefill_tokens`, 16384) and chunk budget
  (`chunked_prefill_size`, vLLM's `max_num_batched_tokens` here). A request needs
  `extend + min(max_new_tokens - output, 4096) + 1` tokens below the free and evictable slots
  less what the pass reserved: every running request's
  `min(max_new_tokens - output, 4096) * new_token_ratio`, and each request it admitted
  `extend + 1 + min(max_new_tokens, 4096)`. A request whose prompt exceeds the chunk budget left
  is cut there and reserves nothing for its output; it continues first in the next pass
  (`add_chunked_req`). A refusal for memory marks the batch full: no admission is tried again
  until a request leaves the running batch (`batch_is_full`).
- **new_token_ratio** (`scheduler_components/new_token_ratio_tracker.py`): starts at 0.7
  (`SGLANG_INIT_NEW_TOKEN_RATIO` times `schedule_conservativeness` 1.0), falls by
  `(0.7 - 0.098) / 600` at every decode step without a retraction down to 0.098 (factor 0.14).
- **Retraction** (`update_running_batch`; `ScheduleBatch.check_decode_mem`, `retract_decode` in
  `schedule_batch.py`): a decode step needs one slot per request; when the free and evictable
  slots fall short, requests are retracted fewest output tokens first, the longer prompt first
  among equals, at least one and until the rest fit, keeping one; each frees its KV without
  inserting its output into the cache and goes to the back of the queue, to re-prefill prompt and
  output. The ratio becomes `min(1, (output + 20 * n) / (max_new_tokens + 1))` summed over the
  n requests left.
- **Radix cache** (`rlsim.sim.radix_cache`): LRU eviction of unlocked leaves; a prefilled chunk
  enters the tree when the next batch is scheduled (`stash_chunked_request`), a finished prefill
  with its result, a finished request's whole sequence when it finishes.
- **Pages** (`--page-size`; `RadixKey.page_aligned`, `alloc_paged_token_slots_*` in
  `mem_cache/allocation.py`): the tree matches, holds and evicts whole pages, so a prompt's partial
  last page stays its request's own; a request holds whole pages; admission reserves a page a
  request and counts extends in pages; a chunk is cut at a page boundary; decoding takes a page
  when a request's token starts one, after evicting as if every request took one.
- **Idle** (`Scheduler.on_idle`): a loop pass that finds the engine fully idle resets the ratio.
- **Arrival** (`init_req_max_new_tokens`, `validate_input_length`): an output is clipped to what the
  pool holds beside its prompt; a prompt the pool cannot hold is aborted (`own_abort`).
  Requests come one per sample by default, as veRL and slime send them: a group's samples
  admitted in the same pass each prefill the prompt (matching happens at admission), and the
  duplicate slots are given back when they are inserted; a sample admitted later hits the cached
  prompt.
- **Parallel sampling** (`parallel_sampling`; `TokenizerManager._handle_batch_request` in
  `tokenizer_manager.py`): a group sent as one request with `n > 1` is first sent as a warm-up of
  its prompt alone (`max_new_tokens` 0, so it finishes at its prefill and its prompt enters the
  tree), and the n samples are sent once its result is processed; each then matches all of the
  prompt but its last token, which it computes (`add_call`).
- **Weight updates** (`flush_cache_after_weight_update`, `scheduler_components/weight_updater.py`):
  the radix cache is flushed (`free_all`, called by `SimEngine.weights_updated`); SGLang flushes
  only when idle, so frameworks retract what runs first (`pause_generation(mode="retract")`).
- **Overlap scheduler** (`event_loop_overlap`): the next batch is scheduled before the last
  one's results are processed, so a finished request keeps its slots and place one more schedule:
  one that stopped on an end-of-sequence token decodes one more token, one that reached
  `max_new_tokens` is left out of the batch (`_reqs_finishing_inflight`); output counts read at
  a schedule lag the batch in flight, and a retracted request loses that batch's token. A decode
  step that does not fit while such a request still holds its slots waits for them.

The engine drives it as it drives vLLM's (`rlsim.sim.rollout_scheduler.RolloutScheduler`): a
decoding request's tokens are counted from the decode step it started at, and between events a
fixed decode batch jumps to its next finish or slot shortage (`jump_plan`, `advance`), held equal
to the step-by-step path by tests.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque

import numpy as np

from rlsim.config import SGLangSettings
from rlsim.errors import RlsimError
from rlsim.protocol import Request
from rlsim.sim.radix_cache import Node, RadixCache
from rlsim.sim.running_offsets import RunningOffsets
from rlsim.sim.seq import QueueQueries, Scheduled, Seq, count_hits

DEFAULTS = SGLangSettings()  # SGLang's own (`--schedule-conservativeness`, its SGLANG_* variables)
CLIP_MAX_NEW_TOKENS = DEFAULTS.clip_max_new_tokens_estimation  # 4096
INIT_NEW_TOKEN_RATIO = DEFAULTS.init_ratio  # 0.7 times schedule_conservativeness 1.0
MIN_NEW_TOKEN_RATIO = DEFAULTS.min_ratio  # times SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR 0.14
NEW_TOKEN_RATIO_DECAY = DEFAULTS.ratio_decay  # (INIT - MIN) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS 600
RETRACT_DECODE_STEPS = DEFAULTS.retract_decode_steps  # 20
WAITING_PREFIX_REFRESH_INTERVAL = 32  # schedule_policy.py (SGLANG_ENABLE_WAITING_PREFIX_REFRESH on)
WAITING_QUEUE_PREFIX_MATCH_MAX = 128  # lpm over a longer queue falls back to fcfs
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32
MAX_PREFILL_TOKENS = 16384  # --max-prefill-tokens
SGLANG_VERSION = "0.5.23"
SCHEDULE_POLICIES = ("fcfs", "lpm")  # --schedule-policy (SGLang's default: fcfs)


def check_settings(schedule_policy: str, page_size: int) -> None:
    """Refuse a schedule policy or page size SGLang's rules here do not have (both implementations)."""
    if schedule_policy not in SCHEDULE_POLICIES:
        raise RlsimError(f"unknown SGLang schedule policy {schedule_policy!r}: use {' or '.join(SCHEDULE_POLICIES)}")
    if page_size < 1:
        raise RlsimError(f"SGLang's page size must be positive, got {page_size}")


def pool_too_small(tokens: int, pool: int) -> RlsimError:
    """The error for a request of `tokens` KV tokens that cannot decode even alone in a pool of `pool`."""
    return RlsimError(
        f"a request of {tokens} KV tokens cannot decode in a pool of {pool}: raise --gpu-memory-utilization or lower "
        "--max-response-len"
    )
# A decoding request's heap key, `finish step << 32 | rid + 2**31`: ordered as (finish step, rid),
# compared as one int (request ids, warm-ups' negative ones too, lie within +-2**31)
_RID_BITS, _RID_OFFSET = 32, 2**31
_RID_MASK = (1 << _RID_BITS) - 1
_REFUSED_PROMPT = -(2**62)  # the one-token prompt SGLang gives a refused request (token 0, shared by all)


def _check_rid(rid: int) -> None:
    """A caller's request id must fit its heap key (warm-ups take the negative ones)."""
    if not 0 <= rid < _RID_OFFSET:
        raise RlsimError(f"request id {rid} is out of range: ids run from 0 to 2**31 - 1")


class SGLangScheduler(QueueQueries):
    """SGLang's `Scheduler` for one instance: waiting queue, running batch, radix cache, prefill
    admission, retraction and `new_token_ratio` (a `rlsim.sim.rollout_scheduler.RolloutScheduler`)."""

    def __init__(
        self,
        num_tokens: int,
        max_running_requests: int,
        chunked_prefill_size: int,
        enable_chunked_prefill: bool = True,
        enable_radix_cache: bool = True,
        overlap: bool = True,
        max_prefill_tokens: int = MAX_PREFILL_TOKENS,
        schedule_policy: str = "fcfs",
        parallel_sampling: bool = False,
        settings: SGLangSettings = DEFAULTS,
        page_size: int = 1,
    ) -> None:
        check_settings(schedule_policy, page_size)
        self.schedule_policy = schedule_policy
        self.settings = settings
        self._init_ratio, self._min_ratio, self._decay = settings.init_ratio, settings.min_ratio, settings.ratio_decay
        self._clip, self._retract_steps = settings.clip_max_new_tokens_estimation, settings.retract_decode_steps
        self.parallel_sampling = parallel_sampling
        self._warmups: dict[int, list[Seq]] = {}  # a warm-up's request id (negative) -> the samples it holds back
        self._warmups_sent = 0
        self._refused: dict[int, tuple] = {}  # request id -> (why SGLang aborted it at arrival, its request as sent)
        self.page = page_size  # --page-size: KV tokens a page (the pool is counted in tokens, by whole pages)
        num_tokens = num_tokens // page_size * page_size  # (SGLang's pool holds whole pages)
        self.num_tokens = num_tokens  # the KV pool's token slots
        self.max_running_requests = max_running_requests
        self.chunked_prefill_size = chunked_prefill_size if enable_chunked_prefill else None
        self.max_prefill_tokens = max_prefill_tokens
        self.overlap = overlap
        self.cache = RadixCache(num_tokens, enable_radix_cache)
        self.waiting: deque[Seq] = deque()
        self.running: dict[int, Seq] = {}  # request id -> Seq: the running batch, then the chunked request
        self.chunked: Seq | None = None  # the request whose prompt is being prefilled in chunks
        self.finishing: list[Seq] = []  # overlap: finished, their slots held until the next schedule
        self.batch_is_full = False
        self.new_token_ratio = self._init_ratio
        self.iters = 0  # iterations run
        self.dsteps = 0  # decode steps run: a decoding request's clock
        self.heap: list[int] = []  # decoding requests' (finish decode step, rid), keyed as one int
        self.num_decoding = 0
        self.ctx = 0.0  # KV tokens of the running requests (the cost model's C)
        self.rate_sum = self.verify_sum = 0.0  # one token a step per decoding request
        self.spec: dict[int, Seq] = {}  # speculative decoding is modelled for vLLM only
        self._hold: dict[int, tuple[Node, int]] = {}  # rid -> (its locked node, the tokens that node's path covers)
        self._refresh_calls = 0  # prefill passes that reached the policy (`_waiting_prefix_refresh_calls`)
        self._takes_last_batch = False  # the next schedule takes this prefill batch as the running batch
        self._offsets = RunningOffsets()  # the running batch's reservations, summed at each prefill pass
        self._aborting: set[int] = set()  # aborted requests that still run their last decode step
        self._pending_insert: list[Seq] = []  # overlap: prefills whose tree insert waits for their result
        self._stash: Seq | None = None  # the chunked request, its last chunk not yet in the tree
        self._last_prefill: set[int] | None = set()  # rids the last iteration prefilled (None: it decoded)
        self._order = 0
        self.prefix_hit_tokens = 0
        self.turn_tokens = self.turn_hit_tokens = 0
        self.retractions = 0
        self.warmups_run = 0  # parallel sampling: warm-ups finished

    # ---- queue changes -----------------------------------------------------------------------
    def add(self, seq: Seq) -> None:
        if seq.rate != 1.0:
            raise RlsimError("speculative decoding is modelled under vLLM's rules only: use --rollout-engine vllm")
        _check_rid(seq.req.request_id)
        self._arrive(seq)
        self.waiting.append(seq)

    def _arrive(self, seq: Seq) -> None:
        """SGLang's checks as a request arrives (`handle_generate_request`): its output is clipped to
        what the pool could hold with it alone (`init_req_max_new_tokens`: `max_req_len - input - 1`
        and `max_new_tokens_for_memory`, `max_req_len = kv - 1` with a page of one token), and a
        prompt of `max_req_len - 5` tokens or more is refused (`validate_input_length`): SGLang
        queues it as a one-token prompt that finishes, aborted, at its prefill, and goes on. Such a
        request is reported as aborted (`own_abort`), not finished."""
        req = seq.req
        ntok = req.num_prompt_tokens + seq.generated
        max_req_len = self.num_tokens - 1
        if self._too_long(ntok):
            self._refused[req.request_id] = ("prompt_too_long", req)
            seq.req = req._replace(prompt_id=_REFUSED_PROMPT, num_prompt_tokens=1, max_tokens=1, prompt_len=0,
                                   kept_tokens=0)  # fmt: skip
            seq.generated, seq.target = 0, 1
            return
        paged = -(-ntok // self.page) * self.page
        room = max(0, min(max_req_len - ntok - 1, self.num_tokens - paged - self.page - 1))
        if req.max_tokens - seq.generated > room:  # (finishes at "length" there)
            seq.req = req._replace(max_tokens=seq.generated + room)
            seq.target = min(seq.target, seq.generated + room)

    def _too_long(self, ntok: int) -> bool:
        """`validate_input_length`: an input of `max_req_len - 5` tokens or more (`max_req_len = kv - 1`)."""
        return ntok >= self.num_tokens - 1 - 5

    def own_abort(self, seq: Seq) -> str | None:
        """Why SGLang aborted this ended request of its own accord (None: it did not): "prompt_too_long".
        The request is given back as it was sent."""
        if not self._refused or (got := self._refused.pop(seq.req.request_id, None)) is None:
            return None
        why, seq.req = got
        return why

    @property
    def kv_capacity_tokens(self) -> int:
        """KV tokens the instance holds (its pool's token slots, by whole pages)."""
        return self.num_tokens

    @property
    def groups_calls(self) -> bool:
        """Whether a call's samples run as one request with n > 1 (`--parallel-sampling`)."""
        return self.parallel_sampling

    def add_call(self, seqs: list[Seq]) -> None:
        """One request with `n = len(seqs)` samples of one prompt (`parallel_sampling`): the
        tokenizer manager sends the prompt alone first (`max_new_tokens` 0), and the samples when
        that warm-up's result is processed (`_release`)."""
        if len(seqs) == 1 or any(seq.rate != 1.0 for seq in seqs):
            for seq in seqs:
                self.add(seq)  # (one sample: no warm-up; a speculating one is refused there)
            return
        req = seqs[0].req
        for seq in seqs:
            _check_rid(seq.req.request_id)
        if self._too_long(req.num_prompt_tokens + seqs[0].generated):  # refused, one by one
            for seq in seqs:
                self.add(seq)
            return
        for seq in seqs:
            self._arrive(seq)
        self._warmups_sent += 1
        rid = -self._warmups_sent
        warm = Request(rid, req.prompt_id, -1, req.epoch, req.num_prompt_tokens, 0, 1, req.instance, req.policy_version)
        self._warmups[rid] = list(seqs)
        self.waiting.append(Seq(warm, 1))

    def remove_waiting(self, rids: set[int]) -> list[Seq]:
        gone = [seq for seq in self.waiting if seq.req.request_id in rids]
        if gone:
            self.waiting = deque(seq for seq in self.waiting if seq.req.request_id not in rids)
        for held in self._warmups.values():  # samples a warm-up still holds back
            if any(seq.req.request_id in rids for seq in held):
                gone += [seq for seq in held if seq.req.request_id in rids]
                held[:] = [seq for seq in held if seq.req.request_id not in rids]
        return gone

    # ---- token counts ------------------------------------------------------------------------
    def generated(self, seq: Seq) -> int:
        if not seq.decoding:
            return seq.generated
        return seq.generated + min(self.dsteps - seq.start_iter, seq.target - seq.generated)

    def computed(self, seq: Seq) -> int:
        return seq.computed + (self.dsteps - seq.start_iter if seq.decoding else 0)

    def _lag(self, seq: Seq) -> int:
        """1 where the overlap scheduler has not processed the batch in flight for this request."""
        if not self.overlap or not seq.decoding:
            return 0
        last = self._last_prefill
        return 1 if last is None or seq.req.request_id in last else 0

    def _output_len(self, seq: Seq) -> int:
        """`len(req.output_ids)` as the scheduler reads it at a schedule."""
        return self.generated(seq) - self._lag(seq)

    # ---- one iteration -----------------------------------------------------------------------
    def schedule(self) -> Scheduled:
        out = Scheduled()
        if self._stash is not None:  # `stash_chunked_request`: the last chunk enters the tree now
            seq, self._stash = self._stash, None
            if self.running.get(seq.req.request_id) is seq:
                self._insert_prefix(seq)
        if self._takes_last_batch:
            # the last prefill batch became the running batch (`get_next_batch_to_run` merges it into
            # an empty one by taking it whole), and a new batch is not full
            self._takes_last_batch = False
            self.batch_is_full = False
        if not self._batch_size():
            self.batch_is_full = False
        if self.chunked is not None or (self.waiting and not self.batch_is_full):
            self._prefill(out)
        if not out.chunks:
            self._decode(out)
        if out.chunks or out.num_decodes:  # what the next schedule's output counts lag by
            self._last_prefill = {seq.req.request_id for seq, _ in out.chunks} if out.chunks else None
        return out

    def _lag_mode(self) -> str:
        """Which running requests' output counts lag the batch in flight (`RunningOffsets.total`)."""
        if not self.overlap:
            return "none"
        return "decoding" if self._last_prefill is None else "joined"

    def running_offset_reference(self, ratio: float) -> float:
        """`PrefillAdder`'s offset for the running batch, one request at a time: each one's
        `min(max_new_tokens - output, 4096) * ratio`, summed in batch order (what
        `RunningOffsets` computes at once; tests hold the two equal to the bit)."""
        d, chunked, clip = self.dsteps, self.chunked, self._clip
        last = self._last_prefill
        lag_all = self.overlap and last is None
        lag_some = last if self.overlap and last else ()
        parts = []
        for q in self.running.values():
            if q is chunked:
                continue
            if q.decoding:
                g = q.generated + min(d - q.start_iter, q.target - q.generated)
                if lag_all or q.req.request_id in lag_some:
                    g -= 1
            else:
                g = q.generated
            parts.append(min(q.req.max_tokens - g, clip) * ratio)
        return sum(parts)

    def _batch_size(self) -> int:
        return len(self.running) - (self.chunked is not None)

    def _ceil(self, tokens: int) -> int:
        """`ceil_paged_tokens`: tokens rounded up to whole pages."""
        p = self.page
        return tokens if p == 1 else -(-tokens // p) * p

    def _floor(self, tokens: int) -> int:
        """Tokens rounded down to whole pages (what the radix tree matches and holds)."""
        p = self.page
        return tokens if p == 1 else tokens // p * p

    def _budget(self, offset: float) -> float:
        """`PrefillBudget.remaining_total` (`remaining_current`) under this offset."""
        return self.cache.free + self.cache.evictable - offset

    def _prefill(self, out: Scheduled) -> None:
        size = self._batch_size()
        allocatable = self.max_running_requests - size
        if allocatable <= 0 and self.chunked is None:
            self.batch_is_full = True
            return
        self._calc_priority()
        ratio = self.new_token_ratio
        # The running batch's reservations, summed when first needed: a head that does not fit
        # even with none (they are never negative without warm-ups) is refused without the sum.
        lazy = self.chunked is None and not self._warmups
        clip, page = self._clip, self.page
        total = 0.0 if lazy else self._offsets.total(ratio, self.dsteps, self._lag_mode(), self.iters, clip)
        current = 0.0
        rem_input, rem_chunk = self.max_prefill_tokens, self.chunked_prefill_size
        admitted: list[tuple[Seq, int]] = []
        cache = self.cache
        if self.chunked is not None:  # the chunked request continues first
            seq = self.chunked
            cand = seq.req.num_prompt_tokens + seq.generated - seq.computed
            room = min(rem_chunk, int(self._budget(total))) if rem_chunk is not None else cand
            take = min(cand, room if room > 0 else rem_chunk)
            done = take >= cand
            res = min(seq.req.max_tokens, clip) if done else 0
            paged = self._ceil(take)
            total += paged + page + res
            current += paged + page
            rem_input -= paged
            if rem_chunk is not None:
                rem_chunk -= paged
            admitted.append((seq, take))
            if done:
                self.chunked = None
        waiting, match = self.waiting, cache.match
        # `PrefillBudget`'s checks are written out below, this loop runs at every admission: out of
        # input (`rem_input`, `rem_chunk` spent), NO_TOKEN (`room` less `total` or `current` at most 0)
        while waiting:  # (in queue order, stopping at the first refusal: the admitted are its head)
            seq = waiting[0]
            if rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
                room = cache.free + cache.evictable
                if not (room - total <= 0 or room - current <= 0):
                    break  # `budget_state() == OTHER`: the continuing chunk spent the pass
            if len(admitted) >= allocatable:  # (a continuing chunk keeps its row, and counts)
                self.batch_is_full = True
                break
            req = seq.req
            rid = req.request_id
            ntok = req.num_prompt_tokens + seq.generated
            shared = self._floor(req.prompt_len or req.num_prompt_tokens)
            # `init_next_round_input`, the match locked (pinned while the request is weighed), whole pages
            node, hit = match(req.prompt_id, shared, rid, self._floor(ntok - 1), lock=True)
            # `add_one_req`
            max_new = min(max(req.max_tokens - seq.generated, 0), clip)
            extend = 1 if seq.transfer else ntok - hit
            if lazy:
                lazy = False
                if extend + max_new + page < cache.free + cache.evictable:
                    total = self._offsets.total(ratio, self.dsteps, self._lag_mode(), self.iters, clip)
            if not extend + max_new + page < cache.free + cache.evictable - total:  # (a page of overhead)
                cache.unlock(node)
                self.batch_is_full = bool(admitted) or size > 0  # NO_TOKEN
                break
            if rem_chunk is None and admitted and self._ceil(extend) >= rem_input:
                cache.unlock(node)
                break
            res = min(req.max_tokens, clip)
            chunked = rem_chunk is not None and self._ceil(extend) > rem_chunk
            if chunked:  # cut at a page boundary (its matched prefix is whole pages)
                extend, res = self._floor(rem_chunk), 0
                if extend <= 0:
                    cache.unlock(node)
                    break
            paged = self._ceil(extend)
            total += paged + page + res
            current += paged + page
            rem_input -= paged
            if rem_chunk is not None:
                rem_chunk -= paged
            waiting.popleft()
            self._admit(seq, node, hit)
            admitted.append((seq, extend))
            if chunked:
                self.chunked = seq
            room = cache.free + cache.evictable
            if room - total <= 0 or room - current <= 0:  # the verdict `add_one_req` returns
                self.batch_is_full = True
                break
            if rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
                break
        self._takes_last_batch = not size and any(seq is not self.chunked for seq, _ in admitted)
        if page > 1 and admitted:  # `alloc_paged_token_slots_extend` first evicts for a new page a request
            cache.evict_to_free(sum(take for _, take in admitted) + len(admitted) * page)  # (over-estimated)
        for seq, take in admitted:  # `prepare_for_extend`: their slots (whole pages), evicting as needed
            cache.alloc(self._ceil(seq.computed + take) - self._ceil(seq.computed))
            out.chunks.append((seq, take))
            out.prefill_tokens += take
            self.ctx += take

    def _calc_priority(self) -> None:
        """`SchedulePolicy.calc_priority`: `lpm` over a queue of at most 128 sorts it by the longest
        cached prefix, else (`fcfs`, or `lpm` over a longer queue) the order stays and the waiting
        prefixes are refreshed."""
        lpm = self.schedule_policy == "lpm" and self.cache.enabled  # (lpm without a cache is fcfs)
        if lpm and len(self.waiting) <= WAITING_QUEUE_PREFIX_MATCH_MAX:
            self._sort_by_longest_prefix()
        else:
            self._touch_waiting_prefixes()

    def _sort_by_longest_prefix(self) -> None:
        """`_compute_prefix_matches` and `_sort_by_longest_prefix`: each waiting request matched
        whole against the cache (at most all its tokens but the last count); one whose cached prefix
        is at most 32 tokens and that shares 32 or more with an earlier such request of the queue
        goes last (in-batch prefix caching: one of them prefills the shared part first)."""
        matched: dict[int, float] = {}
        seen: set[int] = set()  # prompts of the requests checked in so far (the simulated waiting tree)
        for seq in self.waiting:
            req = seq.req
            ntok = req.num_prompt_tokens + seq.generated
            shared = self._floor(req.prompt_len or req.num_prompt_tokens)
            _, hit = self.cache.match(req.prompt_id, shared, req.request_id, self._floor(ntok))
            key: float = -min(hit, ntok - 1)
            if hit <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
                if req.prompt_id in seen and shared >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                    key = float("inf")  # deprioritized (its own tokens shared with no one)
                else:
                    seen.add(req.prompt_id)
            matched[req.request_id] = key
        self.waiting = deque(sorted(self.waiting, key=lambda q: matched[q.req.request_id]))

    def _touch_waiting_prefixes(self) -> None:
        """`SchedulePolicy._touch_waiting_prefixes` (fcfs): every 32nd pass walks the cached paths
        of the first 128 waiting requests, the head last, so LRU eviction takes the queue's back first."""
        if not self.waiting or not self.cache.enabled:
            return
        refresh = self._refresh_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0
        self._refresh_calls += 1
        if not refresh:
            return
        head = list(itertools.islice(self.waiting, WAITING_QUEUE_PREFIX_MATCH_MAX))
        for seq in reversed(head):
            req = seq.req
            self.cache.match(req.prompt_id, self._floor(req.prompt_len or req.num_prompt_tokens), req.request_id,
                             self._floor(req.num_prompt_tokens + seq.generated))  # fmt: skip

    def _admit(self, seq: Seq, node: Node, hit: int) -> None:
        """A waiting request joins, holding its matched prefix (locked)."""
        self._hold[seq.req.request_id] = (node, hit)
        seq.computed = hit
        seq.order = self._order
        self._order += 1
        self.running[seq.req.request_id] = seq
        count_hits(self, seq)
        if seq.transfer:  # its KV was moved here: all but the last token are in place
            last = seq.req.num_prompt_tokens + seq.generated - 1
            self.cache.alloc(self._ceil(last) - self._ceil(seq.computed))
            self.ctx += last - seq.computed
            seq.computed, seq.transfer = last, False

    def _decode(self, out: Scheduled) -> None:
        """`update_running_batch`: one token for every decoding request, retracting on shortage."""
        n = self.num_decoding  # (every decoding request is in the running batch; the chunked one is not)
        if not n:
            self.batch_is_full = False
            return
        holding = n < self._batch_size()  # overlap: finished at max tokens, slots still held
        need = n if self.page == 1 else self._new_pages([s for s in self.running.values() if s.decoding])
        if not self.cache.evict_to_free(need):
            if holding:
                self.batch_is_full = False
                return
            self._retract([s for s in self.running.values() if s.decoding], out)
            n = self.num_decoding
            need = n if self.page == 1 else self._new_pages([s for s in self.running.values() if s.decoding])
        else:
            self.new_token_ratio = max(self.new_token_ratio - self._decay, self._min_ratio)
        if self.page > 1:  # `alloc_paged_token_slots_decode` first evicts for a new page a request (over-estimated)
            self.cache.evict_to_free(n * self.page)
        self.cache.alloc(need)
        out.decode_tokens = out.num_decodes = n
        self.ctx += n

    def _new_pages(self, batch: list[Seq]) -> int:
        """`new_tokens_required_next_decode`: a page for each request whose next token starts one."""
        p, computed = self.page, self.computed
        if p == 1:
            return len(batch)
        return p * sum(1 for s in batch if computed(s) % p == 0)

    def _retract(self, batch: list[Seq], out: Scheduled) -> None:
        keep = sorted(batch, key=lambda s: (self._output_len(s), -(s.req.num_prompt_tokens)), reverse=True)
        first = True
        while first or not self.cache.evict_to_free(self._new_pages(keep)):
            if len(keep) == 1:
                break
            first = False
            seq = keep.pop()
            lag, aborting = self._lag(seq), seq.req.request_id in self._aborting
            self._release(seq, insert=False)
            if seq.reported and seq in self.finishing:  # (ended in flight: no longer freed after this schedule)
                self.finishing.remove(seq)
            seq.generated -= lag  # the batch in flight's token is dropped with it
            self.cache.evict_to_free(len(keep) * self._retract_steps)
            if not aborting:  # (an aborted one is not requeued: the engine has reported it)
                self.waiting.append(seq)
            out.preempted.append(seq)
            self.retractions += 1
        if not self.cache.evict_to_free(self._new_pages(keep)):
            raise pool_too_small(self.computed(keep[0]), self.num_tokens)
        self.new_token_ratio = min(
            1.0,
            (sum(self._output_len(s) for s in keep) + self._retract_steps * len(keep))
            / (sum(s.req.max_tokens for s in keep) + 1),
        )
        self.batch_is_full = False

    def complete(self, out: Scheduled) -> list[Seq]:
        self.iters += 1
        if out.num_decodes:
            self.dsteps += 1
        if self.finishing:
            self.release_finishing()
        if self._pending_insert:
            pending, self._pending_insert = self._pending_insert, []
            for seq in pending:  # overlap: the last batch's prefills, processed after this one launched
                if self.running.get(seq.req.request_id) is seq:
                    self._insert_prefix(seq)
        for seq, take in out.chunks:
            seq.computed += take
            if seq.computed >= seq.req.num_prompt_tokens + seq.generated:
                seq.generated += 1  # the prefill samples the first token
                self._start_decoding(seq)
                # it joins the running batch at its end, in the prefill batch's order (a chunked
                # request's final chunk first), as `merge_batch` appends the last batch
                self.running[seq.req.request_id] = self.running.pop(seq.req.request_id)
                seq.order = self._order
                self._order += 1
                self._offsets.join(seq, self.iters)
                if self.overlap:  # its result, and the tree insert with it, come after the next schedule
                    self._pending_insert.append(seq)
                    continue
            if seq is self.chunked:  # a chunk is stashed into the tree when the next batch is scheduled
                self._stash = seq  # (`stash_chunked_request`, after a pending abort, which discards it)
            else:  # a finished prefill's tokens, when its result is processed
                self._insert_prefix(seq)
        return self.finish_due()

    def _insert_prefix(self, seq: Seq) -> None:
        """`cache_unfinished_req`: the request's prefilled tokens enter the tree, its lock moves to
        their node, and the slots of tokens the tree already held are given back."""
        req = seq.req
        rid = req.request_id
        node, covered = self._hold[rid]
        c, cache = self._floor(seq.computed), self.cache  # (a decoding request's count as of its prefill's end)
        shared = self._floor(req.prompt_len or req.num_prompt_tokens)  # (whole pages; a partial one stays its own)
        new_node, dup = cache.insert(node, covered, req.prompt_id, shared, rid, c, lock=True)  # (locked at once)
        cache.free += dup
        cache.unlock(node)
        self._hold[rid] = (new_node, c if cache.enabled else 0)

    def finish_due(self) -> list[Seq]:
        """The requests whose last token the decode steps so far sampled (an aborted one's last
        step finishes it too, unreported: the engine reported it when it aborted it)."""
        heap, now = self.heap, self.dsteps
        limit = (now + 1) << _RID_BITS  # keys of finish steps up to now lie below it
        if not heap or heap[0] >= limit:
            return []
        due, ended, pop, last = [], [], heapq.heappop, -1
        while heap and heap[0] < limit:
            key = pop(heap)
            if key == last:  # the same finish pushed twice (an abort's re-push, or a retracted request's new
                continue  # finish on its old step): ended once
            last = key
            rid = (key & _RID_MASK) - _RID_OFFSET
            seq = self.running.get(rid)
            if seq is None or not seq.decoding or seq.finish_iter != now:
                continue
            if rid in self._aborting:
                ended.append(seq)
            elif not seq.reported:
                if rid >= 0:  # (a warm-up's finish goes to the tokenizer manager, not the engine's caller)
                    due.append(seq)
                ended.append(seq)
            else:  # overlap: reported, then retracted while its last step was in flight (that token dropped),
                ended.append(seq)  # re-prefilled and ended again, reported once
        if len(ended) > 1:
            ended.sort(key=lambda s: s.order)
        if not self.overlap:
            for seq in ended:  # freed in batch order as their results are processed
                self._release(seq, insert=True)
            return due
        for seq in ended:  # reported now, their slots freed after the next schedule
            seq.reported = True
            if seq.target >= seq.req.max_tokens and seq.req.request_id not in self._aborting:
                self._stop_decoding(seq)  # known finished: left out of the next batch
        self.finishing.extend(ended)
        return due

    def release_finishing(self) -> None:
        if self.finishing:
            done, self.finishing = self.finishing, []
            for seq in done:
                if seq.req.request_id in self.running:
                    self._release(seq, insert=True)

    # ---- decoding and freeing ----------------------------------------------------------------
    def _start_decoding(self, seq: Seq) -> None:
        seq.decoding = True
        seq.start_iter = self.dsteps
        seq.finish_iter = self.dsteps + seq.target - seq.generated
        self.num_decoding += 1
        self.rate_sum += 1.0
        self.verify_sum += 1.0
        heapq.heappush(self.heap, (seq.finish_iter << _RID_BITS) | (seq.req.request_id + _RID_OFFSET))
        self._offsets.update(seq)

    def _stop_decoding(self, seq: Seq, leaving: bool = False) -> None:
        """Fold the decode steps it ran into its counts (`leaving`: it leaves the batch next, so
        its reservation slot is not updated, only dropped)."""
        ran = self.dsteps - seq.start_iter
        seq.generated += min(ran, seq.target - seq.generated)
        seq.computed += ran
        seq.decoding = False
        self.num_decoding -= 1
        self.rate_sum -= 1.0
        self.verify_sum -= 1.0
        if not leaving:
            self._offsets.update(seq)

    def _release(self, seq: Seq, insert: bool) -> int:
        """Take a running request out: with `insert` (finished, aborted) its sequence enters the
        tree (`cache_finished_req`), else (retracted) its uncached tokens are freed outright."""
        if seq.decoding:
            self._stop_decoding(seq, leaving=True)
        req = seq.req
        rid = req.request_id
        del self.running[rid]
        self._offsets.drop(rid)
        if self._aborting:
            self._aborting.discard(rid)
        if seq is self.chunked:
            self.chunked = None
        node, covered = self._hold.pop(rid)
        cache, c = self.cache, seq.computed
        self.ctx -= c
        if insert and cache.enabled:  # its whole pages enter the tree, its partial last page is freed
            end = self._floor(c)
            _, dup = cache.insert(node, covered, req.prompt_id, self._floor(req.prompt_len or req.num_prompt_tokens),
                                  rid, end)  # fmt: skip
            cache.free += dup + self._ceil(c) - end
        else:
            cache.free += self._ceil(c) - covered
        cache.unlock(node)
        self.batch_is_full = False
        seq.computed = 0
        if rid < 0 and insert:  # a warm-up's result is processed: its samples are sent
            self.warmups_run += 1
            self.waiting.extend(self._warmups.pop(rid))
        return seq.generated

    def abort(self, seq: Seq) -> int:
        """`abort_request`: a decoding request gets `to_finish`, which finishes it when the next
        result of a batch that ran it is processed, and it is freed as a finished one: the result of
        its next decode step without the overlap scheduler; with it, the result in flight where the
        last batch ran it (after the next schedule, so it decodes once more meanwhile), else the
        result of its next decode step, processed after the schedule that follows it. A request in
        chunked prefill is freed at once, the chunk it computed last discarded. Returns the tokens
        it had (what the engine reports now)."""
        gen = self.generated(seq)
        if not seq.decoding:  # in chunked prefill (`process_pending_chunked_abort`): the chunks stashed in
            if self._stash is seq:  # the tree stay there, the last one's slots are freed
                self._stash = None
            self._release(seq, insert=False)
            return gen
        if self.overlap and self._lag(seq):  # its result in flight finishes it
            seq.reported = True
            self.finishing.append(seq)
            return gen
        # its next decode step's result finishes it (under overlap, processed after the next
        # schedule, so it decodes twice more where prefills ran since its last decode step)
        self._stop_decoding(seq)
        seq.target = seq.generated + 1
        seq.reported = True
        self._aborting.add(seq.req.request_id)
        self._start_decoding(seq)
        return gen

    def on_idle(self) -> None:
        """`Scheduler.on_idle`, which both event loops call on a pass that schedules nothing: a
        fully idle engine's new-token ratio goes back to its initial value
        (`new_token_ratio_tracker.reset`). RL frameworks leave the engines idle between steps, so
        each step's first admissions reserve at the initial ratio, not where the last step left it."""
        if not (self.running or self.waiting or self.finishing) and self.chunked is None:
            self.new_token_ratio = self._init_ratio

    def free_all(self) -> list[Seq]:
        """Sleep (`release_memory_occupation`, the radix cache flushed): running requests wait
        again, first, with their tokens."""
        self.release_finishing()
        for seq in self.running.values():  # (an aborted one still decoding leaves too, its count with it)
            if seq.decoding:
                self._stop_decoding(seq)
        carried = [q for q in self.running.values() if q.req.request_id not in self._aborting]
        self._aborting.clear()
        for seq in carried:
            seq.computed = 0
        self.running.clear()
        self._offsets.reset()
        self._hold.clear()
        self._pending_insert.clear()
        self._stash = None
        self.heap.clear()
        self.chunked = None
        self.ctx = 0.0
        self.cache.reset()
        self.batch_is_full = False
        self.waiting.extendleft(reversed(carried))
        return carried

    # ---- event jumping -----------------------------------------------------------------------
    def jump_plan(self) -> int:
        """Decode steps the fixed batch runs before its next finish or slot shortage (0: run one).
        Nothing is admitted meanwhile: the queue is empty or the batch is full."""
        if not self.heap or self.chunked is not None or self.finishing or self._stash is not None:
            return 0
        if self._takes_last_batch:
            return 0
        if self.waiting and not self.batch_is_full:
            return 0
        n = self.num_decoding
        if n != len(self.running):
            return 0
        k_finish = (self.heap[0] >> _RID_BITS) - self.dsteps
        if self.page > 1:
            return max(0, self._paged_steps(k_finish))
        k_kv = (self.cache.free + self.cache.evictable) // n
        if self._pending_insert:  # no eviction before the tree inserts its first step processes
            k_kv = min(k_kv, self.cache.free // n)
        return max(0, min(k_finish, k_kv))

    def _page_starts(self) -> np.ndarray:
        """Each decoding request's steps until its next token starts a page (0: the next one does)."""
        p, computed = self.page, self.computed
        return np.fromiter(((-computed(s)) % p for s in self.running.values() if s.decoding), np.int64)

    def _pages_in(self, starts: np.ndarray, k: int) -> int:
        """Slots the decoding requests take over their next k steps: a page each time a token starts one."""
        p = self.page
        return int(p * np.maximum(0, (k - starts - 1) // p + 1).sum())

    def _paged_steps(self, k_finish: int) -> int:
        """With pages: decode steps (at most `k_finish`) whose slots fit the free and evictable ones
        (only the free ones before the tree inserts what the first step processes)."""
        starts = self._page_starts()
        room = self.cache.free if self._pending_insert else self.cache.free + self.cache.evictable
        lo, hi = 0, k_finish
        while lo < hi:  # the most steps whose pages fit (the slots taken grow with the steps)
            mid = (lo + hi + 1) // 2
            if self._pages_in(starts, mid) <= room:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def advance(self, k: int) -> None:
        n = self.num_decoding
        if self.page == 1:
            self.cache.alloc(k * n)
        else:  # each step first evicts for a new page a request: all k steps' evictions, then their pages
            starts = self._page_starts()
            self.cache.evict_to_free(n * self.page + self._pages_in(starts, k - 1))
            self.cache.alloc(self._pages_in(starts, k))
        pending, self._pending_insert = self._pending_insert, []
        for seq in pending:  # overlap: the last prefills' inserts, processed at the first step's end
            if self.running.get(seq.req.request_id) is seq:
                self._insert_prefix(seq)
        self.iters += k
        self.dsteps += k
        self.ctx += k * n
        self._last_prefill = None
        r, decay, floor = self.new_token_ratio, self._decay, self._min_ratio
        for _ in range(k):
            r = max(r - decay, floor)
            if r == floor:
                break
        self.new_token_ratio = r
