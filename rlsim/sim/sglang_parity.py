"""Step parity: rlsim's SGLang rules against SGLang's own `Scheduler`, iteration by iteration.

SGLang's side runs in SGLang's own virtual environment (`rlsim/sim/sglang_parity_driver.py`:
sglang 0.5.23's `Scheduler` built whole on a CPU, only the model's forward scripted); rlsim's side
is `SGLangScheduler`, step by step or through its event jumps (`fast=True`, each jump expanded
into its iterations). Both get the same seeded workload (`rlsim.sim.sched_parity.workload`:
prompt and output lengths, GRPO groups sharing a prompt, arrival waves) and the same limits, and
each iteration is logged on both sides as the requests a prefill batch extends (and by how many
tokens, with the new-token ratio its admission read) or the requests a decode batch runs, by id,
with the requests retracted before it; the test is that both logs are equal and every request
finishes on the same iteration. Between arrivals the engine idles as SGLang's loop does
(`on_idle`); `drain` workloads send each wave once the last has drained, as an RL loop's steps
come, and `sleep` ones put the engine to sleep between them, as veRL does. `SGLangDriver` serves
one workload after another from one driver process (sglang imported once, each `Scheduler` in a
process forked for it: a row of CI's subset then takes 5-40 s instead of 30-70 s on 2 cores).

    RLSIM_SGLANG_PYTHON=/path/to/sglang-venv/bin/python python benchmarks/sglang_parity.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlsim.config import SGLangSettings
from rlsim.errors import RlsimError
from rlsim.protocol import Request
from rlsim.sim import sched_parity
from rlsim.sim.seq import Seq
from rlsim.sim.sglang_scheduler import SGLangScheduler

DRIVER = Path(__file__).with_name("sglang_parity_driver.py")
# the tiny model whose layers SGLang builds (dummy weights; its forward never runs)
TINY_MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 131072,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "torch_dtype": "float32", "eos_token_id": 7,
    "bos_token_id": 1,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class SGLangParityConfig:
    """One workload and one SGLang configuration, as both schedulers see them."""

    name: str
    num_prompts: int = 32
    samples_per_prompt: int = 1
    prompt_tokens: tuple[int, int] = (100, 600)
    output_tokens: tuple[int, int] = (50, 2000)
    output_dist: str = "uniform"  # or "lognormal": heavy-tailed, capped
    waves: int = 1
    wave_gap: int = 200
    kv_tokens: int = 32_000  # --max-total-tokens
    max_running_requests: int = 64
    chunked_prefill_size: int = 2048
    radix_cache: bool = True
    overlap: bool = False  # the overlap scheduler (SGLang's default: on)
    eos: bool = False  # stop on the end-of-sequence token at the drawn length (max_new_tokens = the cap)
    abort_at: int | None = None  # at this iteration, abort every third request not yet finished
    schedule_policy: str = "fcfs"
    parallel_sample: bool = False  # a group arriving together is one request with n > 1 (a warm-up first)
    drain: bool = False  # each wave arrives once the engine has drained and idled (an RL step's, as veRL sends them)
    page_size: int = 1  # --page-size: KV tokens a page
    schedule_conservativeness: float = 1.0  # --schedule-conservativeness
    sglang_env: str = ""  # SGLang's scheduling variables, NAME=VALUE,... (`SGLangSettings`)
    sleep: bool = False  # with `drain`: the engine sleeps and wakes between waves (its KV released, its cache flushed)
    seed: int = 0

    def work(self) -> list[sched_parity.Work]:
        return sched_parity.workload(sched_parity.ParityConfig(
            name=self.name, num_prompts=self.num_prompts, samples_per_prompt=self.samples_per_prompt,
            prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens, waves=self.waves,
            wave_gap=self.wave_gap, output_dist=self.output_dist, seed=self.seed,
        ))  # fmt: skip


_RETRACT = SGLangParityConfig(
    "retract", num_prompts=32, samples_per_prompt=4, output_tokens=(50, 3000), kv_tokens=12_000,
    max_running_requests=128, eos=True,
)  # fmt: skip
# the grid of record (`benchmarks/sglang_parity.py` runs each under both loops); CI runs CI_GRID, `.ci/long` LONG_GRID
GRID = {
    "loose KV": SGLangParityConfig("loose KV", num_prompts=16, samples_per_prompt=4, output_tokens=(20, 400),
                                   kv_tokens=40_000, max_running_requests=32, chunked_prefill_size=1024),
    "tight KV, heavy tail": SGLangParityConfig("tight KV, heavy tail", num_prompts=16, samples_per_prompt=4,
                                               output_tokens=(50, 1500), output_dist="lognormal", kv_tokens=8000,
                                               chunked_prefill_size=1024),
    "tight KV, EOS stops": SGLangParityConfig("tight KV, EOS stops", num_prompts=16, samples_per_prompt=4,
                                              output_tokens=(50, 1500), output_dist="lognormal", kv_tokens=8000,
                                              chunked_prefill_size=1024, eos=True),
    "retractions": _RETRACT,
    "abort wave": SGLangParityConfig("abort wave", num_prompts=16, samples_per_prompt=4, output_tokens=(50, 1000),
                                     kv_tokens=12_000, chunked_prefill_size=1024, waves=2, wave_gap=100, abort_at=150),
    "lpm, arrival waves": SGLangParityConfig("lpm, arrival waves", num_prompts=24, samples_per_prompt=4,
                                             output_tokens=(50, 1500), output_dist="lognormal", kv_tokens=12_000,
                                             chunked_prefill_size=1024, waves=3, wave_gap=150, eos=True,
                                             schedule_policy="lpm"),
    "veRL scale": SGLangParityConfig("veRL scale", num_prompts=64, samples_per_prompt=16, output_tokens=(50, 20_480),
                                     output_dist="lognormal", kv_tokens=400_000, max_running_requests=1024,
                                     chunked_prefill_size=8192, eos=True),
    "parallel sampling": SGLangParityConfig("parallel sampling", num_prompts=24, samples_per_prompt=8,
                                            output_tokens=(50, 1500), output_dist="lognormal", kv_tokens=12_000,
                                            chunked_prefill_size=1024, waves=3, wave_gap=150, eos=True,
                                            parallel_sample=True),
    # an RL loop's steps: each wave arrives once the last has drained and the engine idled (SGLang's
    # `on_idle` resets the new-token ratio), then with veRL's sleep and wake between them
    "idle waves": SGLangParityConfig("idle waves", num_prompts=24, samples_per_prompt=4, output_tokens=(50, 1500),
                                     output_dist="lognormal", kv_tokens=12_000, chunked_prefill_size=1024, waves=3,
                                     eos=True, drain=True),
    "sleep waves": SGLangParityConfig("sleep waves", num_prompts=24, samples_per_prompt=4, output_tokens=(50, 1500),
                                      output_dist="lognormal", kv_tokens=12_000, chunked_prefill_size=1024, waves=3,
                                      eos=True, drain=True, sleep=True),
    # an abort while a long prompt is prefilled in chunks: the chunk computed last is discarded
    "abort mid-chunk": SGLangParityConfig("abort mid-chunk", num_prompts=8, samples_per_prompt=4,
                                          prompt_tokens=(2500, 5000), output_tokens=(50, 600), kv_tokens=40_000,
                                          chunked_prefill_size=1024, abort_at=2),
    # an abort wave while arrivals keep prefilling (the overlap loop's result in flight)
    "abort during prefills": SGLangParityConfig("abort during prefills", num_prompts=32, samples_per_prompt=2,
                                                output_tokens=(50, 800), kv_tokens=30_000, chunked_prefill_size=512,
                                                waves=16, wave_gap=12, abort_at=61),
    # the settings users run with: a conservativeness and SGLang's ratio variables, on a retracting workload
    "ratio settings": dataclasses.replace(
        _RETRACT, name="ratio settings", schedule_conservativeness=1.3,
        sglang_env="SGLANG_INIT_NEW_TOKEN_RATIO=0.6,SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR=0.3,"
        "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS=200,SGLANG_RETRACT_DECODE_STEPS=40,SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION=1024",
    ),
    # prompts the pool cannot hold (aborted at arrival, the engine going on) and outputs clipped to it
    "cannot fit": SGLangParityConfig("cannot fit", num_prompts=16, samples_per_prompt=2, prompt_tokens=(100, 6500),
                                     output_tokens=(50, 3000), kv_tokens=6000, chunked_prefill_size=1024),
    # pages of more than one token (`--page-size`: 64 under MLA backends, 128 under FA4 on Blackwell): whole pages
    # matched, held and evicted, admission and decoding by the page, over retractions and shared prompts
    "pages, retractions": dataclasses.replace(_RETRACT, name="pages, retractions", page_size=64),
    "pages, parallel sampling": SGLangParityConfig("pages, parallel sampling", num_prompts=24, samples_per_prompt=8,
                                                   output_tokens=(50, 1500), output_dist="lognormal",
                                                   kv_tokens=12_000, chunked_prefill_size=1024, waves=3, wave_gap=150,
                                                   eos=True, parallel_sample=True, page_size=16),
}  # fmt: skip
CI_GRID = (("retractions", True), ("abort wave", True), ("tight KV, EOS stops", False), ("lpm, arrival waves", True),
           ("parallel sampling", True), ("sleep waves", False), ("abort mid-chunk", True),
           ("abort during prefills", True), ("ratio settings", True), ("cannot fit", False),
           ("pages, parallel sampling", False))  # fmt: skip
# rows whose every claim a CI row checks too (drained waves, a chunk cut by an abort under the other loop,
# pages and retractions apart): checks too long for CI (`.ci/long`), two minutes of SGLang's side
LONG_GRID = (("idle waves", True), ("abort mid-chunk", False), ("pages, retractions", True))


def abort_rids(cfg: SGLangParityConfig) -> list[int]:
    return [w.request_id for w in cfg.work() if w.request_id % 3 == 0] if cfg.abort_at is not None else []


# ---- rlsim side -------------------------------------------------------------------------------
WARMUP = 9_000_000  # a warm-up's request id on SGLang's side: this plus its prompt's (the driver's)


def _rid(seq: Seq) -> int:
    """A request's id as SGLang's side logs it (a warm-up's, negative here, by its prompt)."""
    rid = seq.req.request_id
    return rid if rid >= 0 else WARMUP + seq.req.prompt_id


def _decoding(s: SGLangScheduler) -> list[int]:
    """The requests the decode batch runs, by id as SGLang's side logs them."""
    return sorted(_rid(q) for q in s.running.values() if q.decoding)


def run_rlsim(cfg: SGLangParityConfig, fast: bool = True, max_iters: int = 1_000_000, compiled: bool = False) -> dict:
    """rlsim's log of the workload: {"iterations": [...], "finish": {rid: iteration}}; `compiled`: the
    compiled core's rules (`rlsim.sim.sglang_rules.SGLangRules`) instead of `SGLangScheduler`."""
    if compiled:  # (numba's, imported only where asked for)
        from rlsim.sim.sglang_rules import SGLangRules
    s = (SGLangRules if compiled else SGLangScheduler)(
        cfg.kv_tokens, cfg.max_running_requests, cfg.chunked_prefill_size, enable_radix_cache=cfg.radix_cache,
        overlap=cfg.overlap, schedule_policy=cfg.schedule_policy, parallel_sampling=cfg.parallel_sample,
        settings=SGLangSettings.parse(cfg.sglang_env, cfg.schedule_conservativeness), page_size=cfg.page_size,
    )  # fmt: skip
    work = sorted(cfg.work(), key=lambda w: (w.arrive, w.request_id))
    if cfg.drain:  # (arrival waves in order; each arrives when the engine has drained: see below)
        starts = sorted({w.arrive for w in work})
        wave_no = {w.request_id: starts.index(w.arrive) for w in work}
        work = [dataclasses.replace(w, arrive=0 if wave_no[w.request_id] == 0 else -1) for w in work]
    rows: list[dict] = []
    finish: dict[str, int] = {}
    i, it, wave, gone = 0, 0, cfg.abort_at, set(abort_rids(cfg))
    while (i < len(work) or s.running or s.waiting) and it < max_iters:
        if wave is not None and it >= wave:  # SGLang aborts a running request, or drops a waiting one
            wave = None
            s.remove_waiting({r for r in gone if str(r) not in finish})
            for rid in sorted(r for r in s.running if r in gone and not s.running[r].reported):
                s.abort(s.running[rid])
        while i < len(work) and 0 <= work[i].arrive <= it:
            group = [work[i]]  # one request or, with parallel sampling, a group arriving together
            i += 1
            while (
                cfg.parallel_sample
                and i < len(work)
                and (work[i].prompt_id, work[i].arrive) == (group[0].prompt_id, group[0].arrive)
            ):
                group.append(work[i])
                i += 1
            call = []
            for w in group:
                cap = cfg.output_tokens[1] if cfg.eos else w.output_tokens
                req = Request(w.request_id, w.prompt_id, 0, 0, w.prompt_tokens, cap, w.output_tokens, 0, 0)
                call.append(Seq(req, w.output_tokens))
            s.add_call(call)
        if not s.running and not s.waiting:  # idle until the next arrival
            s.on_idle()
            if cfg.drain:  # the next wave arrives now, the engine asleep and awake again before it
                if cfg.sleep:
                    s.free_all()
                nxt = wave_no[work[i].request_id]
                work[i:] = [dataclasses.replace(w, arrive=it) if wave_no[w.request_id] == nxt else w for w in work[i:]]
                work[i:] = sorted(work[i:], key=lambda w: (w.arrive if w.arrive >= 0 else 1 << 60, w.request_id))
            it = work[i].arrive
            continue
        k = s.jump_plan() if fast else 0
        if k and i < len(work) and work[i].arrive >= 0:
            k = min(k, work[i].arrive - it)
        if k and wave is not None:
            k = min(k, wave - it)
        if k > 0:
            batch = _decoding(s)
            rows.extend({"at": it + j, "retracted": [], "decode": batch} for j in range(k))
            s.advance(k)
            done = s.finish_due()
            it += k
        else:
            ratio = s.new_token_ratio  # what admission reads this pass
            out = s.schedule()
            if not out.chunks and not out.num_decodes:  # overlap: only finished requests held slots
                s.release_finishing()
                continue
            row: dict = {"at": it, "retracted": [_rid(q) for q in out.preempted]}
            if out.chunks:
                row["extend"] = [[_rid(q), take] for q, take in out.chunks]
                row["ratio"] = ratio
            else:
                row["decode"] = _decoding(s)
                assert len(row["decode"]) == out.num_decodes
            rows.append(row)
            done = s.complete(out)
            it += 1
        for q in done:
            if s.own_abort(q) is None:  # (one SGLang aborted at arrival is not a finish)
                finish[str(q.req.request_id)] = it - 1
    return {"iterations": rows, "finish": finish}


# ---- SGLang side ------------------------------------------------------------------------------
def sglang_python() -> str:
    """The Python of SGLang's own environment: `RLSIM_SGLANG_PYTHON`."""
    py = os.environ.get("RLSIM_SGLANG_PYTHON")
    if not py or not Path(py).exists():
        raise RlsimError(
            "SGLang's parity runs in SGLang's own environment: set RLSIM_SGLANG_PYTHON to its python "
            "(.ci/sglang-env builds one)"
        )
    return py


def _env(sglang_env: str = "") -> dict[str, str]:
    """The driver's environment: this one's, offline, without this environment's packages, and with
    a workload's SGLang settings (SGLang reads them from its environment)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for part in filter(None, sglang_env.split(",")):
        key, _, value = part.partition("=")
        env[key.strip()] = value.strip()
    env.pop("PYTHONPATH", None)
    return env


class SGLangDriver:
    """The driver serving workloads one after another (`sglang_parity_driver.py --serve`): sglang
    imported once, each workload's `Scheduler` in a process forked for it. A context manager; give
    it to `run_sglang` to save a row its imports."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory()
        self._err = Path(self._dir.name) / "driver.err"
        with self._err.open("w") as err:
            self._proc = subprocess.Popen([sglang_python(), str(DRIVER), "--serve"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=err, text=True, env=_env(),
                                          cwd=self._dir.name, start_new_session=True)  # fmt: skip
        self._jobs = 0

    def run(self, name: str, payload: dict, cwd: str, timeout_s: float) -> dict:
        """SGLang's log of one workload (`run_sglang`'s payload), run in `cwd`."""
        self._jobs += 1
        job = {k: str(Path(cwd) / f"job{self._jobs}.{k}") for k in ("workload", "log", "err")} | {"cwd": cwd}
        Path(job["workload"]).write_text(json.dumps(payload))
        self._proc.stdin.write(json.dumps(job) + "\n")
        self._proc.stdin.flush()
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        line = self._proc.stdout.readline() if ready else ""
        if not line:
            why = f"the driver exited:\n{self._err.read_text()[-3000:]}" if ready else f"no answer in {timeout_s:.0f} s"
            self.close(kill=True)
            raise RlsimError(f"{name}: SGLang's scheduler failed: {why}")
        if json.loads(line)["exit"] != 0:
            raise RlsimError(f"{name}: SGLang's scheduler failed:\n{Path(job['err']).read_text()[-3000:]}")
        return json.loads(Path(job["log"]).read_text())

    def close(self, kill: bool = False) -> None:
        """Let the driver end (at once with `kill`: it and a workload it forked, its session)."""
        if self._proc.poll() is None:
            if not kill:
                self._proc.stdin.close()
                try:
                    self._proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    kill = True
            if kill:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._dir.cleanup()

    def __enter__(self) -> SGLangDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_sglang(cfg: SGLangParityConfig, timeout_s: float = 600, driver: SGLangDriver | None = None) -> dict:
    """SGLang's log of the workload, from its own `Scheduler` (`sglang_parity_driver.py`): through
    `driver` where given, unless the workload sets SGLang settings in the environment, which only a
    process started with them reads for sure (then in a process of its own, as without `driver`)."""
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(TINY_MODEL))
        payload = {
            "model_path": str(model), "kv_tokens": cfg.kv_tokens, "max_running_requests": cfg.max_running_requests,
            "chunked_prefill_size": cfg.chunked_prefill_size, "radix_cache": cfg.radix_cache, "overlap": cfg.overlap,
            "schedule_policy": cfg.schedule_policy, "eos": cfg.eos, "max_tokens": cfg.output_tokens[1],
            "requests": [[w.request_id, w.prompt_id, w.prompt_tokens, w.output_tokens, w.arrive] for w in cfg.work()],
            "abort_at": cfg.abort_at, "abort_rids": abort_rids(cfg), "parallel_sample": cfg.parallel_sample,
            "drain": cfg.drain, "sleep": cfg.sleep, "schedule_conservativeness": cfg.schedule_conservativeness,
            "page_size": cfg.page_size,
        }  # fmt: skip
        if driver is not None and not cfg.sglang_env:
            return driver.run(cfg.name, payload, tmp, timeout_s)
        proc = subprocess.run(
            [sglang_python(), str(DRIVER)], input=json.dumps(payload), capture_output=True, text=True,
            timeout=timeout_s, env=_env(cfg.sglang_env), cwd=tmp,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RlsimError(f"{cfg.name}: SGLang's scheduler failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout)


def sglang_chunk_sizes(mib: list[float], timeout_s: float = 300) -> dict[float, int]:
    """SGLang's own chunk budget where a run gives none, for each GPU memory in MiB (the driver
    resolves its server arguments with the memory read as each figure)."""
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(TINY_MODEL))
        proc = subprocess.run(
            [sglang_python(), str(DRIVER)], input=json.dumps({"model_path": str(model), "chunk_sizes_mib": mib}),
            capture_output=True, text=True, timeout=timeout_s, env=_env(), cwd=tmp,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RlsimError(f"SGLang's server arguments failed to resolve:\n{proc.stderr[-3000:]}")
        return {float(k): v for k, v in json.loads(proc.stdout).items()}


# ---- comparing --------------------------------------------------------------------------------
def first_difference(a: dict, b: dict) -> str | None:
    """Where two logs first differ (None if they are equal)."""
    for it, (x, y) in enumerate(zip(a["iterations"], b["iterations"], strict=False)):
        if x != y:
            return f"iteration {it}: rlsim {x} vs SGLang {y}"
    if len(a["iterations"]) != len(b["iterations"]):
        return f"rlsim ran {len(a['iterations'])} iterations, SGLang {len(b['iterations'])}"
    if a["finish"] != b["finish"]:
        diff = sorted(set(a["finish"].items()) ^ set(b["finish"].items()))[:4]
        return f"finish iterations differ: {diff}"
    return None


def counts(log: dict) -> dict:
    """What a log exercised: iterations, prefill and decode ones, retractions, finishes."""
    its = log["iterations"]
    return {
        "iterations": len(its),
        "prefills": sum("extend" in r for r in its),
        "retractions": sum(len(r["retracted"]) for r in its),
        "finished": len(log["finish"]),
    }
