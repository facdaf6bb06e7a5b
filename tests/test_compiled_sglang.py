"""The compiled SGLang scheduler (`rlsim.sim.compiled.sglang`) schedules as `SGLangScheduler`: the
same batches, retractions, finishes, jumps, new-token ratio, radix tree and counters, iteration by
iteration, on random workloads that retract, hit and evict the radix cache, chunk prompts, abort,
sleep, refuse prompts too long and finish under the overlap scheduler, reuse the slots of requests
that left, and send parallel sampling's warm-ups and hold their samples back, compiled and on the
pure-Python path."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlsim.protocol import Request
from rlsim.sim.compiled import sglang as sg
from rlsim.sim.compiled.jit import PURE
from rlsim.sim.seq import Seq
from rlsim.sim.sglang_parity import GRID, first_difference, run_rlsim
from rlsim.sim.sglang_scheduler import DEFAULTS, SGLangScheduler
from tests.pure_path import run_pure
from tests.test_compiled_radix import _tree_c, _tree_py


class _Twin:
    def __init__(self, rng: np.random.Generator, num_tokens: int, max_running: int, chunk: int,
                 chunked: bool = True, radix: bool = True, overlap: bool = True, max_prefill: int = 16384,
                 policy: str = "fcfs", page: int = 1, parallel: bool = False) -> None:  # fmt: skip
        self.py = SGLangScheduler(num_tokens, max_running, chunk, chunked, radix, overlap, max_prefill, policy,
                                  parallel_sampling=parallel, page_size=page)  # fmt: skip
        d = DEFAULTS
        self.c = sg.new_scheduler(num_tokens, max_running, chunk, chunked, radix, overlap, max_prefill,
                                  policy == "lpm", d.init_ratio, d.min_ratio, d.ratio_decay,
                                  d.clip_max_new_tokens_estimation, d.retract_decode_steps, page,
                                  parallel)  # fmt: skip
        self.rng, self.num_tokens, self.parallel = rng, num_tokens, parallel
        self.slot: dict[int, int] = {}  # request id -> compiled slot
        self.next_rid = 0
        self.ops = dict.fromkeys(("iterations", "jumps", "retracted", "finished", "aborted", "prefix_hits",
                                  "slept", "chunked", "refused", "idle", "slots_reused"), 0)  # fmt: skip
        if parallel:
            self.ops.update(calls=0, warmups=0, held_taken=0)

    def submit(self, n: int) -> None:
        rng = self.rng
        if self.parallel and rng.random() < 0.5:  # one call of n samples of a prompt, sent as one request
            self.ops["calls"] += 1
            prompt, npt, max_tokens = int(rng.integers(0, 6)), int(rng.integers(1, 300)), int(rng.integers(4, 120))
            if rng.random() < 0.03:  # a prompt the pool cannot hold: its samples refused one by one
                npt = self.num_tokens - int(rng.integers(1, 6))
            seqs, slots = [], []
            for _ in range(n):
                rid = self.next_rid
                self.next_rid += 1
                target = min(int(rng.integers(1, 140)), max_tokens)
                seqs.append(Seq(Request(rid, prompt, 0, 0, npt, max_tokens, target, 0, 0), target))
                slots.append(sg.new_slot(self.c, rid, prompt, npt, max_tokens, 0, target, 0, False))
                self.slot[rid] = slots[-1]
            self.py.add_call(seqs)
            sg.add_call(self.c, np.array(slots, np.int64))
            return
        for _ in range(n):
            rid, prompt = self.next_rid, int(rng.integers(0, 6))
            self.next_rid += 1
            npt = int(rng.integers(1, 300))
            if rng.random() < 0.01:  # a prompt the pool cannot hold: refused at arrival
                npt = self.num_tokens - int(rng.integers(1, 6))
            max_tokens = int(rng.integers(4, 120))
            target = min(int(rng.integers(1, 140)), max_tokens)
            kept = int(rng.integers(1, target)) if target > 1 and rng.random() < 0.1 else 0
            turn = rng.random() < 0.1
            req = Request(rid, prompt, 0, 0, npt + kept, max_tokens, target, 0, 0, kept_tokens=kept,
                          prompt_len=npt // 2 if turn else 0, more_turns=turn)  # fmt: skip
            seq = Seq(req, target, generated=kept, transfer=kept > 0)
            self.py.add(seq)
            k = sg.new_slot(self.c, rid, prompt, req.num_prompt_tokens, max_tokens, req.prompt_len, target, kept,
                            kept > 0)  # fmt: skip
            sg.add(self.c, k)
            self.slot[rid] = k

    def rids(self, slots: np.ndarray) -> list[int]:
        return [int(self.c.t[sg.C_RID, k]) for k in slots]

    def check(self) -> None:
        py, c = self.py, self.c
        assert (py.iters, py.dsteps, py.ctx, py.num_decoding, py.rate_sum, py.cache.free, py.cache.evictable,
                py.prefix_hit_tokens, py.turn_tokens, py.turn_hit_tokens, len(py.running), len(py.waiting),
                len(py.finishing), py.new_token_ratio, py.batch_is_full, py.retractions) == (
            c.iters, c.dsteps, c.ctx, c.num_decoding, c.rate_sum, c.cache.free, c.cache.evictable,
            c.prefix_hit_tokens, c.turn_tokens, c.turn_hit_tokens, c.num_running, c.w_len, c.num_fin,
            c.new_token_ratio, c.batch_is_full, c.retractions)  # fmt: skip
        assert [seq.req.request_id for seq in py.waiting] == self.rids(sg.waiting(c))
        assert list(py.running) == self.rids(sg.running(c))
        assert [seq.req.request_id for held in py._warmups.values() for seq in held] == self.rids(
            c.hold[: c.num_hold])
        assert (py.warmups_run, len(py._warmups)) == (c.warmups_run, c.num_warm)
        for seq, k in zip(py.running.values(), sg.running(c), strict=True):  # (warm-ups too)
            assert (py.generated(seq), py.computed(seq), seq.req.max_tokens, seq.target) == (
                sg.generated(c, k), sg.computed(c, k), c.t[sg.C_MAX_TOKENS, k], c.t[sg.C_TARGET, k])
        assert _tree_c(c.cache) == _tree_py(py.cache)

    def iterate(self) -> None:
        py, c = self.py, self.c
        k = py.jump_plan()
        assert k == sg.jump_plan(c)
        if k:
            self.ops["jumps"] += 1
            py.advance(k)
            sg.advance(c, k)
            done = py.finish_due()
            sg.finish_due(c)
        else:
            out = py.schedule()
            sg.schedule(c)
            assert (out.decode_tokens, out.prefill_tokens, out.num_decodes) == (
                c.out_decode_tokens, c.out_prefill_tokens, c.out_num_decodes)
            assert [(s.req.request_id, n) for s, n in out.chunks] == list(
                zip(self.rids(c.out_chunk[: c.out_num_chunks]), c.out_take[: c.out_num_chunks].tolist(), strict=True))
            assert [s.req.request_id for s in out.preempted] == self.rids(c.out_preempted[: c.out_num_preempted])
            self.ops["retracted"] += len(out.preempted)
            self.ops["chunked"] += py.chunked is not None
            if not out.num_decodes and not out.chunks and not out.preempted:
                if py.finishing:
                    py.release_finishing()
                    sg.release_finishing(c)
                else:
                    py.on_idle()
                    sg.on_idle(c)
                return
            self.ops["iterations"] += 1
            done = py.complete(out)
            sg.complete(c)
        assert [s.req.request_id for s in done] == self.rids(c.due[: c.num_due])
        assert [py.generated(s) for s in done] == [sg.generated(c, k) for k in c.due[: c.num_due]]
        for s, k in zip(done, c.due[: c.num_due], strict=True):
            refused = py.own_abort(s) is not None
            assert refused == sg.own_abort(c, k)
            assert (s.req.prompt_id, s.req.num_prompt_tokens, s.req.max_tokens) == (
                c.t[sg.C_PROMPT_ID, k], c.t[sg.C_NPT, k], c.t[sg.C_MAX_TOKENS, k])
            self.ops["refused"] += refused
        self.ops["finished"] += len(done)

    def abort(self) -> None:
        py, c = self.py, self.c
        held = [seq for h in py._warmups.values() for seq in h]
        if self.rng.random() < 0.5 and (py.waiting or held):
            rids = {seq.req.request_id for seq in [*py.waiting, *held] if self.rng.random() < 0.3}
            rids = {r for r in rids if r >= 0}  # (a warm-up's id is the tokenizer manager's, not the caller's)
            gone = py.remove_waiting(rids)
            slots = sg.remove_waiting(c, np.array(sorted(rids), np.int64))
            assert [s.req.request_id for s in gone] == self.rids(slots)
            if self.parallel:
                self.ops["held_taken"] += sum(s in held for s in gone)
            for k in slots:  # (as the engine hands them back once it has reported them)
                sg.release_slot(c, k)
        else:
            live = [seq for seq in py.running.values() if not seq.reported and seq.req.request_id >= 0]
            if not live:
                return
            seq = live[int(self.rng.integers(len(live)))]
            assert py.abort(seq) == sg.abort(c, self.slot[seq.req.request_id])
        self.ops["aborted"] += 1

    def run(self, rounds: int) -> None:
        for _ in range(rounds):
            r = self.rng.random()
            if r < 0.12:
                self.submit(int(self.rng.integers(1, 10)))
            elif r < 0.15:
                self.abort()
            elif r < 0.153:
                self.ops["slept"] += 1
                carried = self.py.free_all()
                assert [s.req.request_id for s in carried] == self.rids(sg.free_all(self.c))
            elif self.py.running or self.py.waiting or self.py.finishing:
                self.iterate()
            else:  # a loop pass of an idle engine
                self.py.on_idle()
                sg.on_idle(self.c)
                self.ops["idle"] += 1
            self.check()
        self.ops["prefix_hits"] = self.py.prefix_hit_tokens
        if self.parallel:
            self.ops["warmups"] = self.c.warmups_run
        # (slot 0 is the running list's sentinel; each warm-up took a slot)
        self.ops["slots_reused"] = self.next_rid + self.c.warm_sent + 1 - self.c.num_slots


CONFIGS = [  # engine settings: pool tokens, max running requests, chunk budget, then the rest
    (1000, 16, 256, {}),
    (1500, 16, 128, {"overlap": False}),
    (1200, 16, 256, {"page": 4}),
    (1000, 12, 200, {"policy": "lpm"}),
    (1800, 12, 512, {"chunked": False, "max_prefill": 400}),
    (1600, 12, 128, {"radix": False, "page": 2, "overlap": False}),
    (1400, 16, 256, {"parallel": True}),
    (1400, 16, 128, {"parallel": True, "overlap": False, "page": 2}),
]


@pytest.mark.parametrize("config", range(len(CONFIGS)))
def test_same_iterations(config: int) -> None:
    ops: dict[str, int] = {}
    num_tokens, max_running, chunk, kw = CONFIGS[config]
    for seed in range(3):
        twin = _Twin(np.random.default_rng(seed), num_tokens, max_running, chunk, **kw)
        twin.run(2000)
        for k, v in twin.ops.items():
            ops[k] = ops.get(k, 0) + v
    claimed = [k for k in ops if (k != "prefix_hits" or kw.get("radix", True)) and (k != "chunked" or kw.get(
        "chunked", True))]  # fmt: skip
    assert all(ops[k] > 0 for k in claimed), ops  # the workload reached what it checks


@pytest.mark.skipif(PURE, reason="already on the pure-Python path")
@pytest.mark.long  # (the same checks once more in pure Python)
def test_the_pure_path_agrees() -> None:
    assert f"{len(CONFIGS)} passed" in run_pure(f"{__file__}::test_same_iterations")


# SGLang's parity grid, both loops, but its largest row, "veRL scale" (about 45 s a loop here;
# `benchmarks/sglang_parity.py --compiled` runs it)
PARITY_ROWS = [(name, overlap) for name in GRID if name != "veRL scale" for overlap in (False, True)]


@pytest.mark.parametrize(("name", "overlap"), PARITY_ROWS,
                         ids=[f"{n}-{'overlap' if o else 'normal'}" for n, o in PARITY_ROWS])  # fmt: skip
def test_the_parity_grid_logs_alike_compiled(name: str, overlap: bool) -> None:
    """Every row of SGLang's parity grid (`rlsim.sim.sglang_parity.GRID`) logs the same iterations and
    finishes on the compiled rules as on `SGLangScheduler` (the twin test above holds jumps to steps);
    `tests/test_sglang_parity.py` holds the compiled log to SGLang's own where its environment is built."""
    cfg = dataclasses.replace(GRID[name], overlap=overlap)
    assert first_difference(run_rlsim(cfg), run_rlsim(cfg, compiled=True)) is None
