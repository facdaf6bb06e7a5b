"""The compiled scheduler (`rlsim.sim.compiled.scheduler`) schedules as `InstanceScheduler`:
the same batches, preemptions, finishes, jumps and counters, iteration by iteration, on random
workloads that preempt, hit the prefix cache, abort, sleep and finish under async scheduling,
compiled and on the pure-Python path."""

from __future__ import annotations

import numpy as np
import pytest

from rlsim.protocol import Request
from rlsim.sim.compiled import scheduler as cs
from rlsim.sim.compiled.jit import PURE
from rlsim.sim.scheduler import vllm_scheduler
from rlsim.sim.seq import Seq
from tests.pure_path import run_pure


class _Twin:
    def __init__(self, rng: np.random.Generator, spec: float, **kw: object) -> None:
        self.py, self.c = vllm_scheduler(**kw), cs.new_scheduler(**kw)
        self.rng, self.b, self.spec = rng, kw["block_size"], spec  # spec: the share of speculating requests
        self.slot: dict[int, int] = {}  # request id -> compiled slot
        self.seqs: dict[int, Seq] = {}
        self.next_rid = 0
        self.ops = dict.fromkeys(("iterations", "jumps", "preempted", "finished", "aborted", "prefix_hits",
                                  "slept", "blocked", "speculating"), 0)  # fmt: skip

    def submit(self, n: int) -> None:
        for _ in range(n):
            rid, prompt = self.next_rid, int(self.rng.integers(0, 8))
            self.next_rid += 1
            npt = int(self.rng.integers(1, 12 * self.b))
            max_tokens = int(self.rng.integers(4, 40))
            target = min(int(self.rng.integers(1, 50)), max_tokens)
            kept = int(self.rng.integers(1, target)) if target > 1 and self.rng.random() < 0.1 else 0
            turn = self.rng.random() < 0.1
            req = Request(rid, prompt, 0, 0, npt + kept, max_tokens, target, 0, 0, kept_tokens=kept,
                          prompt_len=npt // 2 if turn else 0, more_turns=turn)  # fmt: skip
            seq = Seq(req, target, generated=kept, transfer=kept > 0)
            if self.rng.random() < self.spec:  # as SimEngine.submit under HistoSpec
                seq.rate = float(self.rng.choice([1.0, 1.25, 1.7, 2.5]))
                seq.verify = seq.rate + float(self.rng.choice([0.0, 0.5, 1.75]))
                seq.lookahead = 3 if seq.rate != 1.0 else 0
            self.seqs[rid] = seq
            self.py.add(seq)
            self.slot[rid] = cs.add(self.c, rid, prompt, req.num_prompt_tokens, max_tokens, req.prompt_len,
                                    turn, target, kept, kept > 0, seq.rate, seq.verify, seq.lookahead)  # fmt: skip

    def rids(self, slots: np.ndarray) -> list[int]:
        return [int(self.c.t[cs.C_RID, k]) for k in slots]

    def check(self) -> None:
        py, c = self.py, self.c
        self.ops["speculating"] += len(py.spec)
        assert len(py.spec) == c.num_spec and py.rate_sum == c.rate_sum and py.verify_sum == c.verify_sum
        assert (py.iters, py.ctx, py.num_decoding, py.pool.free, py.prefix_hit_tokens, py.turn_tokens,
                py.turn_hit_tokens, len(py.running), len(py.waiting)) == (
            c.iters, c.ctx, c.num_decoding, c.pool.free, c.prefix_hit_tokens, c.turn_tokens, c.turn_hit_tokens,
            c.num_running, c.w_len)  # fmt: skip
        assert [seq.req.request_id for seq in py.waiting] == self.rids([cs.waiting_at(c, i) for i in range(c.w_len)])

    def iterate(self) -> None:
        py, c = self.py, self.c
        k = py.jump_plan()
        assert k == cs.jump_plan(c)
        if k:
            self.ops["jumps"] += 1
            py.advance(k)
            cs.advance(c, k)
            done = py.finish_due()
            cs.finish_due(c)
        else:
            out = py.schedule()
            cs.schedule(c)
            assert (out.decode_tokens, out.prefill_tokens, out.num_decodes, out.blocked_by_kv) == (
                c.out_decode_tokens, c.out_prefill_tokens, c.out_num_decodes, c.out_blocked)
            assert [(s.req.request_id, n) for s, n in out.chunks] == list(
                zip(self.rids(c.out_chunk[: c.out_num_chunks]), c.out_take[: c.out_num_chunks].tolist(), strict=True))
            assert [s.req.request_id for s in out.preempted] == self.rids(c.out_preempted[: c.out_num_preempted])
            self.ops["preempted"] += len(out.preempted)
            self.ops["blocked"] += out.blocked_by_kv
            if not out.num_decodes and not out.chunks and not out.preempted:
                if py.finishing:
                    py.release_finishing()
                    cs.release_finishing(c)
                return
            self.ops["iterations"] += 1
            done = py.complete(out)
            cs.complete(c)
        assert [s.req.request_id for s in done] == self.rids(c.due[: c.num_due])
        assert [py.generated(s) for s in done] == [cs.generated(c, k) for k in c.due[: c.num_due]]
        self.ops["finished"] += len(done)

    def abort(self) -> None:
        py, c = self.py, self.c
        if self.rng.random() < 0.5 and py.waiting:
            rids = {seq.req.request_id for seq in py.waiting if self.rng.random() < 0.3}
            gone = py.remove_waiting(rids)
            slots = cs.remove_waiting(c, np.array(sorted(rids), np.int64))
            assert [s.req.request_id for s in gone] == self.rids(slots)
            for k in slots:
                cs.release_slot(c, k)
        else:
            live = [seq for seq in py.running.values() if not seq.reported]
            if not live:
                return
            seq = live[int(self.rng.integers(len(live)))]
            assert py.abort(seq) == cs.abort(c, self.slot[seq.req.request_id])
        self.ops["aborted"] += 1

    def run(self, rounds: int) -> None:
        for _ in range(rounds):
            r = self.rng.random()
            if r < 0.15:
                self.submit(int(self.rng.integers(1, 12)))
            elif r < 0.18:
                self.abort()
            elif r < 0.185:
                self.ops["slept"] += 1
                carried = self.py.free_all()
                assert [s.req.request_id for s in carried] == self.rids(cs.free_all(self.c))
            elif self.py.running or self.py.waiting:
                self.iterate()
            self.check()
        self.ops["prefix_hits"] = self.py.prefix_hit_tokens


CONFIGS = [  # (share of speculating requests, engine settings)
    (0.0, {"num_blocks": 60, "block_size": 4, "max_num_seqs": 8, "max_num_batched_tokens": 32}),
    (0.0, {"num_blocks": 40, "block_size": 2, "max_num_seqs": 16, "max_num_batched_tokens": 64,
           "async_scheduling": True}),
    (0.0, {"num_blocks": 36, "block_size": 4, "max_num_seqs": 6, "max_num_batched_tokens": 48,
           "enable_chunked_prefill": False}),
    (0.0, {"num_blocks": 50, "block_size": 4, "max_num_seqs": 8, "max_num_batched_tokens": 40,
           "enable_prefix_caching": False, "async_scheduling": True}),
    (0.6, {"num_blocks": 60, "block_size": 4, "max_num_seqs": 8, "max_num_batched_tokens": 24}),
    (0.6, {"num_blocks": 45, "block_size": 4, "max_num_seqs": 12, "max_num_batched_tokens": 40,
           "async_scheduling": True}),
]  # fmt: skip


@pytest.mark.parametrize("config", range(len(CONFIGS)))
def test_same_iterations(config: int) -> None:
    ops: dict[str, int] = {}
    for seed in range(3):
        spec, kw = CONFIGS[config]
        twin = _Twin(np.random.default_rng(seed), spec, **kw)
        twin.run(2500)
        for k, v in twin.ops.items():
            ops[k] = ops.get(k, 0) + v
    claimed = [k for k in ops if (k != "prefix_hits" or kw.get("enable_prefix_caching", True))
               and (k != "speculating" or spec)]  # fmt: skip
    assert all(ops[k] > 0 for k in claimed), ops  # the workload reached what it checks


@pytest.mark.skipif(PURE, reason="already on the pure-Python path")
@pytest.mark.long  # (the same checks once more in pure Python)
def test_the_pure_path_agrees() -> None:
    assert f"{len(CONFIGS)} passed" in run_pure(__file__, "-k", "not pure_path")
