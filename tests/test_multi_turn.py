"""Multi-turn trajectories (trace schema 2): the trace, the PolyTrace import, KV reuse across turns,
tool workers, every policy on trajectories, trajectory staleness, fast == exact, bad traces."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from policies.registry import REGISTRY
from rlsim.cli.app import app
from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.driver.turns import ToolConfig
from rlsim.errors import RlsimError
from rlsim.paths import default_trace
from rlsim.profile import load_profile
from rlsim.protocol import Request
from rlsim.sim.engine import SimEngine
from rlsim.sim.simulate import simulate
from rlsim.step_costs import with_engine
from rlsim.trace.format import META_KEY, Trace, TraceMeta, load, save, to_arrow
from tests.test_fast_vs_exact import assert_tables_match

ROOT = Path(__file__).resolve().parents[1]
SEARCH_R1 = ROOT / "traces" / "search_r1.parquet"
LOG = ROOT.parent / "shared" / "data" / "polytrace" / "search_r1_multiturn_0617_0223"
runner = CliRunner()


def mt_trace(rows: list[tuple[int, list[int], list[float], list[int]]], samples: int = 1, cap: int = 1000,
             max_model_len: int | None = None) -> Trace:
    """A multi-turn trace: one (prompt tokens, turn outputs, tool latencies, appended tokens) per
    sample, `samples` samples per prompt in row order."""
    df = pd.DataFrame({
        "epoch": 0, "prompt_id": [i // samples for i in range(len(rows))],
        "sample_idx": [i % samples for i in range(len(rows))],
        "num_prompt_tokens": [r[0] for r in rows], "num_output_tokens": [sum(r[1]) for r in rows],
        "finish_reason": "stop",
        "turn_output_tokens": [r[1] for r in rows],
        "turn_finish_reason": [["tool"] * (len(r[1]) - 1) + ["stop"] for r in rows],
        "tool_latency_s": [r[2] for r in rows], "tool_append_tokens": [r[3] for r in rows],
    })  # fmt: skip
    meta = TraceMeta("test", cap, samples, "synthetic:test", max_model_len=max_model_len)
    return Trace(df, meta)


@functools.lru_cache(maxsize=1)
def search_r1_slice() -> Trace:
    """The first 48 prompts of the bundled Search-R1 trace (3 steps of 16 x 8)."""
    tr = load(SEARCH_R1)
    keep = np.sort(tr.table["prompt_id"].unique())[:48]
    table = tr.table[tr.table["prompt_id"].isin(keep)].reset_index(drop=True)
    return Trace(table.drop(columns="step"), tr.meta)


def _profile(**kw):  # noqa: ANN003, ANN202
    engine = {k: kw.pop(k) for k in list(kw) if k in {f.name for f in dataclasses.fields(EngineConfig)}}
    base = dataclasses.replace(load_profile("h100-qwen2.5-7b-tp1"), **kw)
    return with_engine(base, EngineConfig(**{"async_scheduling": False, **engine}))


def _drain(engine: SimEngine) -> list:
    out = []
    while events := engine.step():
        out += events
    return out


# ---- the trace ------------------------------------------------------------------------------


def test_version_1_traces_load_as_version_2_unchanged() -> None:
    tr = load(default_trace(), columns=[])
    assert tr.meta.schema_version == 2 and tr.meta.max_model_len is None
    assert "turn_output_tokens" not in tr.table.columns
    raw = json.loads(pq.read_schema(default_trace()).metadata[META_KEY])
    assert raw["schema_version"] == 1  # (the bundled file, as written before turns existed)


def test_multi_turn_round_trip(tmp_path: Path) -> None:
    tr = mt_trace([(100, [10, 20, 5], [0.5, 1.0], [30, 40]), (80, [7], [], [])], max_model_len=400)
    back = load(save(tr, tmp_path / "t.parquet"))
    assert back.meta == tr.meta
    assert [list(x) for x in back.table["turn_output_tokens"]] == [[10, 20, 5], [7]]
    assert [list(x) for x in back.table["tool_append_tokens"]] == [[30, 40], []]
    assert list(back.table["num_output_tokens"]) == [35, 7]


def _bad(tmp_path: Path, kind: str) -> Path:
    tr = mt_trace([(100, [10, 20], [0.5], [30]), (100, [10, 20], [0.5], [30])], samples=2, max_model_len=200)
    table = to_arrow(tr)
    col = {name: table[name].to_pylist() for name in table.column_names}
    if kind == "turn_after_stop":
        col["turn_finish_reason"][0] = ["stop", "stop"]
    elif kind == "negative_latency":
        col["tool_latency_s"][1] = [-0.5]
    elif kind == "past_model_len":
        col["tool_append_tokens"][0] = [100]
    elif kind == "sum":
        col["num_output_tokens"][0] = 31
    elif kind == "no_answer":
        col["turn_finish_reason"][0] = ["tool", "tool"]
    elif kind == "calls":
        col["tool_latency_s"][0] = [0.5, 0.5]
    bad = pa.Table.from_pydict(col, schema=table.schema)
    if kind == "missing":
        bad = bad.drop_columns(["tool_latency_s"])
    path = tmp_path / "bad.parquet"
    pq.write_table(bad, path)
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [("turn_after_stop", "a turn follows a turn that ended with 'stop'"),
     ("negative_latency", "a tool latency is negative"),
     ("past_model_len", "exceed max_model_len=200"),
     ("sum", "num_output_tokens is not the sum of its turns' tokens"),
     ("no_answer", "ends in a tool call that no turn answers"),
     ("calls", "one tool_latency_s and one tool_append_tokens per tool call"),
     ("missing", "but not 'tool_latency_s'")],
)  # fmt: skip
def test_bad_multi_turn_traces_get_one_sentence_and_exit_2(tmp_path: Path, kind: str, message: str) -> None:
    path = _bad(tmp_path, kind)
    for args in (["trace", "inspect", str(path)], ["simulate", "--trace", str(path), "--out", str(tmp_path / "r")]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.output
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


# ---- the import -----------------------------------------------------------------------------


def _log_line(step: int, group: int, sample: int, turns: list[tuple[int, int, str]], calls: list[tuple[int, float]],
              end: str = "stop") -> str:
    """One PolyTrace trajectory: turns as (prompt tokens, completion tokens, finish reason)."""
    return json.dumps({
        "step": step, "prompt_len": turns[0][0], "max_response_len": 500, "max_model_len": 2000,
        "prompt_group_id": group, "sample_id": sample, "finish_reason": end, "validate": False,
        "turns": [{"turn": k, "prompt_tokens": p, "cached_tokens": 0, "completion_tokens": c, "finish_reason": f,
                   "engine_latency_s": 1.0} for k, (p, c, f) in enumerate(turns)],
        "tool_calls": [{"turn": k, "tool_name": "search", "latency_s": s, "append_len": 0} for k, s in calls],
    })  # fmt: skip


def test_polytrace_multi_turn_import(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    lines = [
        _log_line(0, 0, 0, [(50, 10, "tool_calls"), (100, 20, "stop")], [(0, 0.2), (0, 0.7)]),
        _log_line(0, 0, 1, [(50, 5, "tool_calls"), (50, 8, "tool_calls")], [(0, 0.1), (1, 0.3)]),  # retokenised shorter
        _log_line(0, 1, 0, [(60, 30, "stop")], []),
        _log_line(0, 1, 1, [(60, 500, "length")], [], end="length"),
    ]
    (log / "multiturn_workload_step_0.jsonl").write_text("\n".join(lines) + "\n")
    partial = _log_line(1, 0, 0, [(50, 10, "stop")], [])
    (log / "multiturn_workload_step_1.jsonl").write_text(partial + "\n")  # a partial step: dropped
    out = tmp_path / "t.parquet"
    r = runner.invoke(app, ["trace", "import", str(log), "--out", str(out), "--model", "m"])
    assert r.exit_code == 0, r.output
    assert "dropped as partial" in r.output and "1 trajectories end on a tool call" in r.output
    tr = load(out)
    df = tr.table
    assert tr.meta.max_model_len == 2000 and tr.meta.max_response_len == 500 and tr.meta.samples_per_prompt == 2
    assert [list(x) for x in df["turn_output_tokens"]] == [[10, 20], [5, 8], [30], [500]]
    assert [list(x) for x in df["turn_finish_reason"]] == [["tool", "stop"], ["tool", "stop"], ["stop"], ["length"]]
    assert [list(x) for x in df["tool_append_tokens"]] == [[40], [0], [], []]  # 100 - 50 - 10; retokenised: 0
    assert [round(x[0], 6) for x in df["tool_latency_s"][:2]] == [0.7, 0.1]  # a turn's calls run together
    assert list(df["num_output_tokens"]) == [30, 13, 30, 500]


@pytest.mark.skipif(not LOG.is_dir(), reason="the Search-R1 PolyTrace log is not beside the checkout")
def test_bundled_search_r1_trace_is_the_import_of_the_log(tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    r = runner.invoke(app, ["trace", "import", str(LOG), "--out", str(out), "--model", "Qwen2.5-7B-Instruct"])
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == SEARCH_R1.read_bytes()


# ---- the engine: KV reuse across turns ------------------------------------------------------


def _turns_on_one_instance(kv_tokens: int, between: list[Request]) -> tuple[int, int]:
    """Turn 0 (prompt 100, 50 tokens), then `between`, then turn 1 (context 100 + 50 + 30 tool
    tokens); (turn 1's context, its prefix-hit tokens)."""
    eng = SimEngine(_profile(kv_capacity_tokens=kv_tokens), 1)
    eng.submit([Request(0, 0, 0, 0, 100, 1000, 50, 0, 0, more_turns=True)])
    _drain(eng)
    if between:
        eng.submit(between)
        _drain(eng)
    eng.submit([Request(0, 0, 0, 0, 180, 1000, 20, 0, 0, prompt_len=100)])
    _drain(eng)
    sched = eng.instances[0].sched
    return sched.turn_tokens, sched.turn_hit_tokens


def test_next_turn_hits_the_earlier_turns_kv_while_cached() -> None:
    """149 computed tokens (the last sampled token is never fed back): 9 full blocks of 16 hit."""
    assert _turns_on_one_instance(100_000, []) == (180, 144)
    # another request between the turns leaves them cached when the cache has room
    assert _turns_on_one_instance(100_000, [Request(1, 1, 0, 0, 300, 1000, 1, 0, 0)]) == (180, 144)


def test_next_turn_prefills_again_once_its_kv_was_evicted() -> None:
    """A 20-block cache: a request between the turns takes blocks from the front of the free
    queue. Freed blocks go there tail first (vLLM's reverse-order free), so 19 blocks evict all
    but the trajectory's first block (one block hit), and 20 evict it all: turn 1 prefills its
    whole context again."""
    assert _turns_on_one_instance(320, [Request(1, 1, 0, 0, 300, 1000, 1, 0, 0)]) == (180, 16)
    assert _turns_on_one_instance(320, [Request(1, 1, 0, 0, 310, 1000, 1, 0, 0)]) == (180, 0)


def test_last_turn_frees_its_kv_as_a_finished_request() -> None:
    """After the last turn nothing of the trajectory's own chain stays hittable."""
    eng = SimEngine(_profile(), 1)
    eng.submit([Request(0, 0, 0, 0, 100, 1000, 50, 0, 0, more_turns=True)])
    _drain(eng)
    from rlsim.sim.compiled.block_pool import own_key

    state = eng.instances[0].sched.s
    assert own_key(0) in state.pool.head  # its own chain's full blocks, cached
    eng.submit([Request(0, 0, 0, 0, 180, 1000, 20, 0, 0, prompt_len=100)])
    _drain(eng)
    assert own_key(0) not in state.pool.head


# ---- the driver: tool workers ---------------------------------------------------------------


def _tool_run(workers: int | None, n: int = 6, latency: float = 10.0):  # noqa: ANN202
    tr = mt_trace([(64, [32, 16], [latency], [8])] * n, samples=n)
    rl = RLConfig(prompts_per_step=1, samples_per_prompt=n, max_response_len=1000, epochs=1)
    cl = ClusterConfig(num_gpus=1, profile="h100-qwen2.5-7b-tp1")
    return simulate(tr, "sync", cl, rl, tools=ToolConfig(tool_workers=workers))


def test_tool_workers_limit_concurrent_calls() -> None:
    """Six equal trajectories end their first turn together: with no limit each waits the call's
    10 s; with one worker the calls queue, waiting 10, 20, ... 60 s."""
    free = _tool_run(None).summary["multi_turn"]
    one = _tool_run(1).summary["multi_turn"]
    assert free["tool_calls"] == one["tool_calls"] == 6
    assert free["tool_wait_s"] == pytest.approx(60.0)
    assert one["tool_wait_s"] == pytest.approx(10 * (1 + 2 + 3 + 4 + 5 + 6))
    # the one instance runs nothing while all six wait: 10 s idle with no limit (less the finished
    # requests' one extra iteration under async scheduling), more while the calls queue
    assert free["gpu_idle_during_tools_s"] == pytest.approx(10.0, abs=0.05)
    assert one["gpu_idle_during_tools_s"] > 10.0
    assert free["turns"] == 12 and free["turns_per_trajectory"] == 2


def test_tool_latency_sweep_grows_step_time() -> None:
    """Synthetic tool latencies (0.1 s to 60 s) on the Search-R1 slice: the step time grows with
    them, and past some latency the tool wait dominates the trajectories' time."""
    rl = RLConfig(prompts_per_step=16, samples_per_prompt=8, max_response_len=3000, epochs=1, max_steps=1)
    cl = ClusterConfig(num_gpus=2, profile="h100-qwen2.5-7b-tp1")
    share, total = [], []
    for lat in (0.1, 6.0, 60.0):
        s = simulate(search_r1_slice(), "sync", cl, rl, tables=False, tools=ToolConfig(tool_latency_s=lat)).summary
        share.append(s["multi_turn"]["tool_wait_share"])
        total.append(s["total_time_s"])
    assert total == sorted(total) and share == sorted(share)
    assert share[0] < 0.1 and share[-1] > 0.5


# ---- every policy on trajectories -----------------------------------------------------------

RL = RLConfig(prompts_per_step=16, samples_per_prompt=8, max_response_len=3000, epochs=1, max_steps=3)


def _cluster(name: str) -> ClusterConfig:
    if name in ("fully_async", "areal"):
        return ClusterConfig(num_gpus=4, profile="h100-qwen2.5-7b-tp1", placement="disaggregated", train_gpus=2)
    return ClusterConfig(num_gpus=2, profile="h100-qwen2.5-7b-tp1")


@functools.cache
def _policy_run(name: str):  # noqa: ANN202
    return simulate(search_r1_slice(), name, _cluster(name), RL, tables=True)


@pytest.mark.parametrize("name", [*REGISTRY, "seer(chunk_tokens=64)"])
def test_every_policy_runs_on_trajectories(name: str) -> None:
    """Each policy trains whole trajectories: a trained sample's length is its turns' tokens."""
    res = _policy_run(name)
    mt = res.summary["multi_turn"]
    assert mt["tool_calls"] > 0 and mt["turns"] > mt["tool_calls"]
    assert 0.3 < mt["turn_prefix_hit_rate"] < 0.8
    trained = res.requests[res.requests["trained_step"] >= 0]
    table = search_r1_slice().table.set_index(["prompt_id", "sample_idx"])["num_output_tokens"]
    want = table.loc[list(zip(trained["prompt_id"], trained["sample_idx"], strict=True))].to_numpy()
    assert len(trained) and (trained["num_output_tokens"].to_numpy() == want).all()


CARRYING = [  # (policy, a fixed tool latency, whether a trajectory's turns can span an update)
    ("async_partial", None, True), ("one_step_off", None, True), ("k_step_off(k=2)", None, True),
    ("areal", None, True), ("sortedrl(mode=partial)", None, True), ("histopipe(cross_step=true)", None, True),
    # fully_async's syncs: an interrupting one carries trajectories waiting on a tool into the new
    # weights (5 s tools, so that some wait at a sync); a draining one waits for whole trajectories
    ("fully_async(trigger_parameter_sync_step=1)", 5.0, True),
    ("fully_async(trigger_parameter_sync_step=1,partial_rollout=false)", 5.0, False),
]


def test_sync_trains_every_trajectory_under_the_weights_it_started_with() -> None:
    s = _policy_run("sync").summary
    assert s["staleness_max"] == 0 and s["multi_turn"]["turn_version_span_max"] == 0


@pytest.mark.parametrize(("name", "latency", "spans"), CARRYING)
def test_trajectory_staleness_under_carrying_policies(name: str, latency: float | None, spans: bool) -> None:
    """A policy that carries samples across an update trains some trajectories one or more
    versions stale (the version its step sees minus its first turn's); where a trajectory waits
    on a tool or runs a turn across an update, its later turns launch under newer weights than
    its first (the turn version span)."""
    cl = _cluster(name.split("(")[0])
    s = simulate(search_r1_slice(), name, cl, RL, tables=False, tools=ToolConfig(tool_latency_s=latency)).summary
    assert s["staleness_max"] >= (2 if name.startswith("k_step_off(k=2)") else 1), name
    assert (s["multi_turn"]["turn_version_span_max"] >= 1) == spans, s["multi_turn"]


@pytest.mark.parametrize("name", ["sync", "rollpacker", "async_partial", "areal", "seer(chunk_tokens=64)"])
def test_fast_equals_exact_on_a_multi_turn_trace(name: str) -> None:
    """The event-jumping fast path and --exact agree on every request and step of a multi-turn
    run, whose turns hit the prefix cache and whose tool calls leave instances idle."""
    fast = _policy_run(name)
    exact = simulate(search_r1_slice(), name, _cluster(name), RL, exact=True)
    assert fast.summary["multi_turn"]["tool_calls"] > 0 and fast.summary["multi_turn"]["turn_prefix_hit_rate"] > 0
    a, b = fast.summary["multi_turn"], exact.summary["multi_turn"]
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-9, err_msg=key)
    assert_tables_match(fast.requests, exact.requests, f"{name} requests")
    assert_tables_match(fast.steps, exact.steps, f"{name} steps")


def test_divided_rollout_cuts_turns_into_chunks() -> None:
    """Seer with chunks shorter than many turns: a turn cut at a chunk is resumed from its kept
    tokens (its KV moved) until the trajectory ends; every trajectory trains whole, and the turns
    and prefix hits are the undivided run's."""
    divided = _policy_run("seer(chunk_tokens=64)")
    whole = _policy_run("seer")
    assert (divided.requests["outcome"] == "continued").sum() > 100
    for key in ("turns", "tool_calls", "turn_prefix_hit_rate"):
        assert divided.summary["multi_turn"][key] == whole.summary["multi_turn"][key], key


# ---- the fitted generator -------------------------------------------------------------------


def test_shipped_search_r1_preset_is_the_fit_on_steps_0_to_2() -> None:
    """`search-r1` is the generator fitted on the log's steps 0-2 (doctables/multi_turn.py
    --write-preset), and generates valid multi-turn traces whose shape is the held-out steps'."""
    from rlsim.trace.turn_model import fit, load_model, synthesize, trajectory_stats

    trace = load(SEARCH_R1)
    fit_set = Trace(trace.table[trace.table["step"] <= 2].reset_index(drop=True), trace.meta)
    shipped = load_model("search-r1")
    assert shipped == fit(fit_set, "search-r1")
    test_set = Trace(trace.table[trace.table["step"] >= 3].reset_index(drop=True), trace.meta)
    a, b = trajectory_stats(test_set), trajectory_stats(synthesize(shipped, 512, 8, 1, seed=0))
    for k in ("turns per trajectory", "trajectory length mean", "appended tokens per call mean", "final context mean"):
        assert b[k] == pytest.approx(a[k], rel=0.05), k


def test_synth_and_fit_commands_on_multi_turn(tmp_path: Path) -> None:
    out = tmp_path / "g.parquet"
    r = runner.invoke(app, ["trace", "synth", "--preset", "search-r1", "--num-prompts", "16", "--samples-per-prompt",
                            "4", "--epochs", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "turns per trajectory" in r.output
    tr = load(out)
    assert tr.meta.max_model_len == 7096 and "turn_output_tokens" in tr.table.columns
    again = tmp_path / "g2.parquet"
    runner.invoke(app, ["trace", "synth", "--preset", "search-r1", "--num-prompts", "16", "--samples-per-prompt",
                        "4", "--epochs", "1", "-o", str(again)])
    assert again.read_bytes() == out.read_bytes()  # same seed, same bytes
    preset = tmp_path / "p.json"
    r = runner.invoke(app, ["trace", "fit", str(SEARCH_R1), "--steps", "0-2", "--test-steps", "3-4", "-o", str(preset)])
    assert r.exit_code == 0, r.output
    assert "held-out steps 3-4" in r.output and json.loads(preset.read_text())["kind"] == "multi_turn"
    r = runner.invoke(app, ["trace", "fit", str(SEARCH_R1), "--steps", "9", "-o", str(tmp_path / "q.json")])
    assert r.exit_code == 2 and "holds none of these steps" in r.stderr


# ---- the built-in multi-turn task -----------------------------------------------------------


def test_tool_lookup_task_and_its_reward() -> None:
    from rlsim.trace.tasks import CALL_WORD, agent_task, lookup, task_trace, tool_reward

    tr = task_trace("tool-lookup", num_prompts=4, samples_per_prompt=2, epochs=3, max_response_len=48)
    agent = agent_task(tr)
    assert agent is not None and agent.call_id == CALL_WORD + 2 and agent.max_turns == 2
    assert agent_task(task_trace("stop-within", 4, 2, 1, 48)) is None
    text = tr.table["prompt_text"].iloc[0]
    key = int(text.split()[0][1:])
    assert agent.answer_ids(text) == [lookup(key) + 2]
    answer = agent.answer_ids(text)
    assert tool_reward([[7, 8, 9]], answer) == 0.0  # no call
    assert tool_reward([[7, agent.call_id], [9, 9]], answer) == 0.5  # called, answer not used
    assert tool_reward([[7, agent.call_id], [9, answer[0]]], answer) == 1.0  # called and used
    with pytest.raises(RlsimError, match="tiny_model's words"):
        task_trace("tool-lookup", 4, 2, 1, 48, style="text")


def test_a_real_run_refuses_a_multi_turn_trace_in_one_sentence(tmp_path: Path) -> None:
    """A logged trajectory's turns cannot be forced on a real model: the real engines run a task
    whose model decides its turns (tool-lookup), and nothing is written."""
    out = tmp_path / "r"
    r = runner.invoke(app, ["run", "--real", "--trace", str(SEARCH_R1), "--model", str(tmp_path / "m"), "--train",
                            "none", "--out", str(out)])  # fmt: skip
    assert r.exit_code == 2 and "is a multi-turn trace" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()
