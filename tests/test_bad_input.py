"""Bad input across every command: one sentence and exit code 2, never a traceback, never data
lost. Each case is a class of input tried on a real command."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.errors import RlsimError
from rlsim.plan.grid import parse_grid
from rlsim.plan.sweep import run_sweep
from rlsim.profile import PROFILE_DIR
from rlsim.trace.format import META_KEY, Trace, save

from .conftest import CODER_LOG_DIR, REPO

runner = CliRunner()
SMALL = {"num_prompts": 32, "trace_epochs": 1, "epochs": 1, "prompts_per_step": 16, "samples_per_prompt": 4}


def _refused(args: list[str], message: str) -> None:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (args, r.exit_code, r.output)
    assert message in r.stderr, (args, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.output


# ---- data loss ------------------------------------------------------------------------------


def test_sweep_refuses_to_overwrite_a_parquet_that_is_not_a_sweep(tmp_path: Path, small_trace_path: Path) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"fixed": SMALL, "grid": {"gpus": [4]}}))
    before = small_trace_path.read_bytes()
    _refused(["sweep", str(grid), "--out", str(small_trace_path)], "not a sweep result (no point_id column)")
    assert small_trace_path.read_bytes() == before


def test_a_different_grid_never_drops_another_grids_rows(tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    first = run_sweep(parse_grid({"fixed": SMALL, "grid": {"gpus": [4], "policy": ["sync", "rollpacker"]}}), out)
    second = parse_grid({"fixed": SMALL, "grid": {"gpus": [8]}})
    with pytest.raises(RlsimError, match="holds 2 rows of another grid"):
        run_sweep(second, out)
    assert len(pd.read_parquet(out)) == 2
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"fixed": SMALL, "grid": {"gpus": [8]}}))
    _refused(["sweep", str(grid), "--out", str(out), "--workers", "1"], "holds 2 rows of another grid")
    r = runner.invoke(app, ["sweep", str(grid), "--out", str(out), "--workers", "1", "--force"])
    assert r.exit_code == 0, r.output
    rows = pd.read_parquet(out)
    assert len(rows) == 3
    kept = rows[rows["point_id"].isin([f["point_id"] for f in first])].sort_values("point_id")
    want = pd.DataFrame(first).sort_values("point_id")
    assert kept["epoch_time_s"].tolist() == want["epoch_time_s"].tolist()  # unchanged


def test_simulate_force_swaps_the_run_directory_in_whole(tmp_path: Path, small_trace_path: Path) -> None:
    """A run is written beside the old one and swapped in: a kill mid-write leaves the old run
    whole (here: the write fails on purpose), and no temporary directory is left behind."""
    from rlsim.config import ClusterConfig, RLConfig
    from rlsim.report import write_run_dir
    from rlsim.sim.simulate import simulate
    from rlsim.trace.format import load

    out = tmp_path / "run"
    args = ["simulate", "--trace", str(small_trace_path), "--gpus", "4", "--prompts-per-step", "8", "--max-steps",
            "2", "--epochs", "1", "-o", str(out)]  # fmt: skip
    assert runner.invoke(app, args).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    res = simulate(load(small_trace_path), "rollpacker", ClusterConfig(num_gpus=4),
                   RLConfig(prompts_per_step=8, samples_per_prompt=4, epochs=1, max_steps=2))  # fmt: skip
    with pytest.raises(AttributeError):  # the steps table is missing: the write fails half way
        write_run_dir(dataclasses.replace(res, steps=None), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert runner.invoke(app, [*args, "--policy", "rollpacker", "--force"]).exit_code == 0
    assert json.loads((out / "config.json").read_text())["policy"] == "rollpacker"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]

    # a stop (SIGTERM unwinds as SystemExit) between any two steps of the swap takes it back whole:
    # just after the temporary folder is made, before its name is returned; and between moving the
    # old run aside and moving the new one in
    real_mkdtemp, real_rename = tempfile.mkdtemp, Path.rename

    def stopped_mkdtemp(*a, **k):  # noqa: ANN002, ANN003, ANN202
        real_mkdtemp(*a, **k)
        raise SystemExit(143)

    def stopped_rename(self: Path, target: Path):  # noqa: ANN202
        if self.name.endswith(".tmp"):
            raise SystemExit(143)
        return real_rename(self, target)

    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for where, patch in ((tempfile, ("mkdtemp", stopped_mkdtemp)), (Path, ("rename", stopped_rename))):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(where, *patch)
            with pytest.raises(SystemExit):
                write_run_dir(res, out)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before, patch[0]
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], patch[0]


def _default_sigint() -> None:
    """A shell without job control starts background commands (a CI script run with `&`) with
    SIGINT ignored, which their children inherit and Python then keeps; the sweep under test
    must see Ctrl-C as a terminal would deliver it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_a_sweep_promptly_and_keeps_finished_rows(tmp_path: Path) -> None:
    grid = tmp_path / "g.yaml"
    # 400 points (about 4 s through 2 workers): enough that Ctrl-C after the second row always
    # lands mid-sweep, however fast a point is
    doc = {"fixed": {**SMALL, "num_prompts": 64}, "grid": {"gpus": [4, 8, 16, 32], "seed": list(range(100))}}
    grid.write_text(yaml.safe_dump(doc))
    out = tmp_path / "s.parquet"
    proc = subprocess.Popen([sys.executable, "-m", "rlsim.cli", "sweep", str(grid), "--out", str(out), "--workers",
                             "2"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)  # fmt: skip
    deadline = time.time() + 120
    while not (out.exists() and len(pd.read_parquet(out)) >= 2) and time.time() < deadline:
        time.sleep(0.2)
    assert out.exists(), "no point finished"
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the whole process group
    t0 = time.time()
    _, err = proc.communicate(timeout=60)
    assert time.time() - t0 < 20, "the sweep computed the remaining points before exiting"
    assert proc.returncode == 130 and "interrupted:" in err and "Traceback" not in err
    saved = len(pd.read_parquet(out))
    assert 2 <= saved < 400
    r = runner.invoke(app, ["sweep", str(grid), "--out", str(out), "--workers", "1"])
    assert r.exit_code == 0 and len(pd.read_parquet(out)) == 400  # the rerun resumes


# ---- output paths ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compare", "--plot", "MISSING/b.png", "--max-steps", "1"], "does not exist"),
        (["compare", "--plot", "FILE/b.png", "--max-steps", "1"], "is a file, not a directory"),
        (["compare", "--plot", "DIR", "--max-steps", "1"], "is a directory; give a file path"),
        (["plan", "--target-epoch-hours", "3", "--plot", "MISSING/p.png"], "does not exist"),
        (["simulate", "-o", "FILE", "--max-steps", "1"], "is a file; give a directory path"),
        (["simulate", "-o", "FILE/run", "--max-steps", "1"], "is a file, not a directory"),
        (["sweep", "GRID", "--out", "DIR"], "is a directory; give a file path"),
        (["trace", "synth", "-o", "DIR", "--num-prompts", "4"], "is a directory; give a file path"),
        (["trace", "synth", "-o", "MISSING/t.parquet", "--num-prompts", "4"], "does not exist"),
        (["trace", "inspect", "TRACE", "--plot", "FILE/cdf.png"], "is a file, not a directory"),
        (["trace", "fit", "TRACE", "-o", "DIR"], "is a directory; give a file path"),
        (["calibrate", "fit", "DIR", "-o", "MISSING/p.json"], "does not exist"),
        (["run", "--real", "-o", "FILE", "--model", "DIR", "--train", "none"], "is a file; give a directory path"),
        (["run", "--real", "-o", "FILE/run", "--model", "DIR", "--train", "none"], "is a file, not a directory"),
        (["trace", "import", "CODER", "-o", "FILE/t.parquet"], "is a file, not a directory"),
    ],
)
def test_output_paths_are_checked_before_any_work(tmp_path: Path, small_trace_path: Path, args, message) -> None:  # noqa: ANN001
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"fixed": SMALL, "grid": {"gpus": [4]}}))
    sub = {"MISSING": str(tmp_path / "missing"), "FILE": str(tmp_path / "file"), "DIR": str(tmp_path / "dir"),
           "GRID": str(grid), "TRACE": str(small_trace_path), "CODER": str(CODER_LOG_DIR)}  # fmt: skip
    args = [next((a.replace(k, v) for k, v in sub.items() if a.startswith(k)), a) for a in args]
    _refused(args, message)
    assert not list((tmp_path / "dir").iterdir())  # synth leaves no .tmp behind


# ---- policies, profiles, numbers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "message"),
    [("rollpacker(eta_p=nan)", "must be a finite number"), ("rollpacker(eta_r=inf)", "must be a finite number"),
     ("os:getcwd", "is not a policy class")],
)  # fmt: skip
def test_bad_policies(small_trace_path: Path, policy: str, message: str) -> None:
    _refused(["simulate", "--trace", str(small_trace_path), "--policy", policy, "--max-steps", "1"], message)


@pytest.mark.parametrize(
    ("change", "message"),
    [({"train": {"flops_per_token": 1.0, "peak_flops_per_gpu": 1e15, "mfu": 0.0, "fixed_s": 1.0}},
      "field 'train.mfu' must be in (0, 1]"),
     ({"spec": [1, 2]}, "field 'spec' must be an object"),
     ({"kv_capacity_tokens": 100}, "does not fit an instance's KV cache of 100 tokens"),
     ({"beta_s": "NaN"}, "field 'beta_s' must be a finite number"),
     ({"t_w_s": 1e9}, "the coefficients are seconds per iteration"),
     ({"beta_s": 1e300}, "a coefficient is in the wrong unit"),
     ({"block_size": 10**9}, "block_size 1000000000 exceeds the KV capacity"),
     ({"gpu_memory_utilization": 5.0}, "field 'gpu_memory_utilization' must be in (0, 1]"),
     ({"t_w_s": 1e-300, "alpha_s": 0, "beta_s": 0, "gamma_s": 0, "linear_t0_s": 0}, "below the memory roofline")],
)  # fmt: skip
def test_bad_profiles(tmp_path: Path, small_trace_path: Path, change: dict, message: str) -> None:
    raw = json.loads((PROFILE_DIR / "h100-qwen2.5-7b-tp1.json").read_text()) | change
    raw.pop("model_facts") if "kv_capacity_tokens" in change else None  # keep the tiny capacity as given
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw).replace('"NaN"', "NaN"))
    _refused(["simulate", "--trace", str(small_trace_path), "--profile", str(path), "--gpus", "1", "--max-steps", "1",
              "-o", str(tmp_path / "run")], message)  # fmt: skip
    _refused(["simulate", "--trace", str(small_trace_path), "--profile", str(tmp_path), "--max-steps", "1"],
             "is a directory")  # fmt: skip


def test_bad_numbers_and_ranges(tmp_path: Path, small_trace_path: Path) -> None:
    for cmd in (["compare"], ["plan", "--target-epoch-hours", "3"]):
        _refused([*cmd, "--workers", "-1"], "Invalid value for '--workers'")
    _refused(["plan", "--target-epoch-hours", "nan"], "--target-epoch-hours must be a positive number")
    _refused(["plan", "--target-epoch-hours", "3", "--gpus", "3..3"], "--tp 4 does not divide 3 GPUs")
    _refused(["plan", "--target-epoch-hours", "3", "--trace", str(small_trace_path), "--max-response-len", "99999"],
             "exceeds the trace's cap")  # fmt: skip
    grid = tmp_path / "g.yaml"
    trace_point = {"trace": str(small_trace_path), "max_response_len": 99999, "prompts_per_step": 16,
                   "samples_per_prompt": 4, "epochs": 1}  # a trace file, not a synthesised one
    grid.write_text(yaml.safe_dump({"fixed": trace_point, "grid": {"gpus": [4]}}))
    _refused(["sweep", str(grid), "--out", str(tmp_path / "s.parquet")], "exceeds the trace's cap")
    sweep_out = str(tmp_path / "s.parquet")
    _refused(["sweep", str(grid), "--out", sweep_out, "--workers", "-1"], "Invalid value for '--workers'")
    grid.write_bytes(b"fixed: {gpus: 4}\n# \xff\xfe\n")
    _refused(["sweep", str(grid), "--out", str(tmp_path / "s.parquet")], "is not UTF-8 text")
    _refused(["run", "--real", "-o", str(tmp_path / "r"), "--model", str(tmp_path), "--trace", str(small_trace_path),
              "--train", "none", "--max-response-len", "0"], "--max-response-len must be positive")  # fmt: skip


def test_bad_run_settings(tmp_path: Path, small_trace_path: Path) -> None:
    trace = ["--trace", str(small_trace_path), "--max-steps", "1"]
    _refused(["simulate", *trace, "--seed", "-1", "-o", str(tmp_path / "a")], "seed must be >= 0")
    _refused(["simulate", *trace, "--reward-latency", "nan", "-o", str(tmp_path / "b")], "reward_latency_s must be")
    _refused(["compare", *trace, "--policies", ",,"], "names no policy")


def test_usage_errors_are_one_line() -> None:
    """An unknown command or option, or a value of the wrong type or choice, is one line too."""
    _refused(["simulate", "--gpus", "abc"], "Invalid value for '--gpus'")
    _refused(["simulate", "--nope"], "No such option: --nope")
    _refused(["nope"], "No such command 'nope'")
    _refused(["trace", "import", "x", "--format", "nope", "-o", "y.parquet"], "'nope' is not one of")
    _refused(["trace", "synth"], "Missing option '--out'")


def test_policies_command_lists_every_policy_and_its_knobs() -> None:
    r = runner.invoke(app, ["policies"])
    assert r.exit_code == 0
    for text in ("rollpacker", "eta_p=1.25", "sortedrl", "mode=on_policy", "+histospec", "arXiv 2509.21009"):
        assert text in r.output


# ---- trace files ----------------------------------------------------------------------------


def _rewrite(path: Path, table: pa.Table | None = None, meta: bytes | None = None) -> Path:
    table = table if table is not None else pq.read_table(path)
    if meta is not None:
        table = table.replace_schema_metadata({META_KEY: meta})
    out = path.with_name("bad.parquet")
    pq.write_table(table, out)
    return out


@pytest.mark.parametrize(
    ("kind", "message"),
    [("corrupt", "cannot be read"), ("meta_utf8", "not UTF-8"), ("meta_source", "source must be a string"),
     ("meta_nan_cap", "max_response_len must be an integer"), ("meta_float_cap", "max_response_len must be an integer"),
     ("meta_huge", "must fit in 64 bits"), ("sample_idx", "sample_idx must be below samples_per_prompt"),
     ("utf8_data", "cannot be read"), ("meta_schema", "this rlsim reads trace schema 1 to 2")],
)  # fmt: skip
def test_bad_trace_files(small_trace: Trace, tmp_path: Path, kind: str, message: str) -> None:
    path = save(small_trace, tmp_path / "t.parquet")
    meta = json.loads(pq.read_schema(path).metadata[META_KEY])
    if kind == "corrupt":
        raw = bytearray(path.read_bytes())
        col = pq.ParquetFile(path).metadata.row_group(0).column(3)  # num_prompt_tokens
        at = col.data_page_offset + 24  # past the page header: the compressed values
        raw[at : at + 32] = b"\x00" * 32
        bad = tmp_path / "bad.parquet"
        bad.write_bytes(bytes(raw))
    elif kind == "meta_utf8":
        bad = _rewrite(path, meta=b"\xff\xfe{}")
    elif kind == "utf8_data":  # string bytes that are not UTF-8 (pyarrow reads them; pandas cannot)
        t = pq.read_table(path)
        offsets = pa.array(range(t.num_rows + 1), pa.int32()).buffers()[1]
        col = pa.Array.from_buffers(pa.string(), t.num_rows, [None, offsets, pa.py_buffer(b"\xff" * t.num_rows)])
        bad = _rewrite(path, t.set_column(t.column_names.index("finish_reason"), "finish_reason", col))
    elif kind == "sample_idx":
        t = pq.read_table(path)
        idx = t["sample_idx"].to_pylist()
        idx[0] = 7
        bad = _rewrite(path, t.set_column(t.column_names.index("sample_idx"), "sample_idx", pa.array(idx, pa.int32())))
    else:
        value = {"meta_source": {"source": 5}, "meta_nan_cap": {"max_response_len": float("nan")},
                 "meta_schema": {"schema_version": 99},
                 "meta_float_cap": {"max_response_len": 2048.5},
                 "meta_huge": {"max_response_len": 2**70}}[kind]  # fmt: skip
        bad = _rewrite(path, meta=json.dumps(meta | value).encode())
    _refused(["trace", "inspect", str(bad)], message)


# ---- calibration records and run directories ------------------------------------------------


def test_malformed_calibration_records(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    out = str(tmp_path / "p.json")
    (rec / "facts.json").write_text("{not json")
    _refused(["calibrate", "fit", str(rec), "-o", out], "is not valid JSON")
    (rec / "facts.json").write_text(json.dumps({"model": "m"}))
    _refused(["calibrate", "fit", str(rec), "-o", out], "lacks 'hardware'")
    facts = {"model": "m", "hardware": "cpu", "tensor_parallel_size": 1, "kv_capacity_tokens": 1024, "block_size": 16,
             "max_num_seqs": 8, "max_num_batched_tokens": 64, "num_gpu_blocks": 65}  # fmt: skip
    (rec / "facts.json").write_text(json.dumps(facts))
    (rec / "iterations.parquet").write_bytes(b"garbage")
    _refused(["calibrate", "fit", str(rec), "-o", out], "is not a readable Parquet file")
    pd.DataFrame({"x": [1]}).to_parquet(rec / "iterations.parquet")
    _refused(["calibrate", "fit", str(rec), "-o", out], "lacks column 'phase'")
    cols = ["phase", "step_s", "num_generation_requests", "num_ctx_requests", "context_tokens", "num_ctx_tokens",
            "num_generation_tokens"]  # fmt: skip
    pd.DataFrame({c: pd.Series([], dtype="float64") for c in cols}).to_parquet(rec / "iterations.parquet")
    _refused(["calibrate", "fit", str(rec), "-o", out], "only 0 usable iterations")


@pytest.mark.parametrize(
    ("config", "message"),
    [("{oops", "is not valid JSON"), ("[1, 2]", "must hold a JSON object"), (json.dumps({"mode": "real"}), "lacks"),
     (json.dumps({"mode": "sim"}), "is not a real run")],
)  # fmt: skip
def test_malformed_run_directories(tmp_path: Path, config: str, message: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(config)
    _refused(["validate", str(run)], message)
    _refused(["run", "--real", "--resume", "-o", str(run)], message)


def test_run_directory_with_corrupt_tables_or_checkpoint(tmp_path: Path, small_trace_path: Path) -> None:
    """A complete real-run config whose tables or checkpoint are missing, corrupt or foreign."""
    from rlsim.config import ClusterConfig, EngineConfig, RLConfig, config_dict
    from rlsim.profile import load_profile
    from rlsim.real.config import RealConfig
    from rlsim.report import to_json

    run = tmp_path / "run"
    run.mkdir()
    rl = RLConfig(prompts_per_step=8, samples_per_prompt=4, epochs=1)
    config = config_dict(ClusterConfig(num_gpus=1), rl, RealConfig(model=str(tmp_path)), EngineConfig()) | {
        "mode": "real", "policy": "sync", "trace_path": str(small_trace_path),
        "profile": load_profile("h100-qwen2.5-7b-tp1").to_dict(),
    }  # fmt: skip
    (run / "config.json").write_text(to_json(config))
    _refused(["validate", str(run)], "has no finished step yet")
    (run / "steps.parquet").write_bytes(b"PAR1 garbage")
    _refused(["validate", str(run)], "steps.parquet is not a readable Parquet file")
    pd.DataFrame({"x": [1]}).to_parquet(run / "steps.parquet")
    _refused(["validate", str(run)], "steps.parquet lacks column 'step'")
    steps = {"step": [0], "time/start": [0.0], "timing_s/gen": [1.0], "timing_s/step": [2.0], "bubble_ratio": [0.1]}
    pd.DataFrame(steps).to_parquet(run / "steps.parquet")
    _refused(["validate", str(run)], "has no requests.parquet: the run directory is incomplete")
    pd.DataFrame({"x": [1]}).to_parquet(run / "requests.parquet")
    _refused(["validate", str(run)], "requests.parquet lacks column 'step'")
    pd.DataFrame({"step": [0], "outcome": ["finished"], "finish_time": [1.0], "num_output_tokens": [5]}).to_parquet(
        run / "requests.parquet"
    )
    (run / "config.json").write_text(to_json(config | {"RLConfig": {"not_a_knob": 1}}))
    _refused(["validate", str(run)], "holds a config this rlsim cannot read")
    _refused(["run", "--real", "--resume", "-o", str(run)], "holds a config this rlsim cannot read")
    (run / "config.json").write_text(to_json(config))
    (run / "checkpoint.pkl").write_bytes(b"\x80\x04truncated")
    try:
        import vllm  # noqa: F401
    except ImportError:  # without vLLM the run stops at its first check, in one sentence too
        _refused(["run", "--real", "--resume", "-o", str(run)], "vLLM")
    else:
        _refused(["run", "--real", "--resume", "-o", str(run)], "checkpoint.pkl cannot be read")
    assert (run / "checkpoint.pkl").read_bytes() == b"\x80\x04truncated"  # nothing rewritten


# ---- the kinds of bad input a new user's sweep found ----------------------------------------
# Each kind below had cases that ran silently wrong, ended in a traceback, hung, said something
# unclear, or behaved unlike the other commands; at least two cases of each.

MODEL_CFG = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "vocab_size": 1000,
             "intermediate_size": 2048}  # fmt: skip


def _small_run(trace: Path, out: Path) -> list[str]:
    return ["simulate", "--trace", str(trace), "--gpus", "4", "--max-steps", "1", "-o", str(out)]


def _multi_turn_trace(tmp_path: Path, **meta_changes: object) -> Path:
    """The bundled multi-turn trace cut to 8 prompts, with its metadata changed."""
    from rlsim.paths import bundled
    from rlsim.trace.format import load

    tr = load(bundled("search_r1.parquet"))
    df = tr.table[tr.table["prompt_id"].isin(sorted(tr.table["prompt_id"].unique())[:8])]
    table = pa.Table.from_pandas(df.reset_index(drop=True), preserve_index=False)
    raw = json.loads(pq.read_schema(bundled("search_r1.parquet")).metadata[META_KEY])
    for key, value in meta_changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    path = tmp_path / "mt.parquet"
    pq.write_table(table.replace_schema_metadata({META_KEY: json.dumps(raw).encode()}), path)
    return path


# silently wrong


@pytest.mark.parametrize("setting", [{"trainer": "megatron"}, {"terms": "nemo-rl"}])
def test_derived_profiles_of_other_settings_never_share_a_cached_file(tmp_path: Path, monkeypatch, setting) -> None:  # noqa: ANN001
    """Two runs that derive the same model on the same GPU with another --trainer or --terms each
    read their own profile (the cache is keyed by everything that changes its content)."""
    from rlsim.derive.cache import derived_profile_path

    monkeypatch.setenv("RLSIM_CACHE_DIR", str(tmp_path))
    plain = derived_profile_path("qwen2.5-7b", "h100", 2)
    plain_bytes = Path(plain).read_bytes()
    other = derived_profile_path("qwen2.5-7b", "h100", 2, **setting)
    assert other != plain and Path(plain).read_bytes() == plain_bytes
    assert Path(other).read_bytes() != plain_bytes


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"num_key_value_heads": 0}, "'num_key_value_heads' must be a positive integer"),
        ({"num_experts": 0}, "'num_experts' must be a positive integer"),
        ({"num_experts": 4, "num_experts_per_tok": 8, "moe_intermediate_size": 256},
         "'num_experts_per_tok' (8) is more than the model's 4 routed experts"),
        ({"head_dim": -64}, "'head_dim' must be a positive integer"),
    ],
)  # fmt: skip
def test_impossible_model_configs_are_refused(tmp_path: Path, extra: dict, message: str) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**MODEL_CFG, **extra}))
    _refused(["profile", "derive", "--model", str(cfg), "--gpu", "h100", "-o", str(tmp_path / "p.json")], message)
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_a_multi_turn_trace_without_max_model_len_is_refused(tmp_path: Path, command: str) -> None:
    trace = _multi_turn_trace(tmp_path, max_model_len=None)
    args = [command, "--trace", str(trace), "--gpus", "4", "--max-steps", "1"]
    args += ["-o", str(tmp_path / "run")] if command == "simulate" else ["--policies", "sync"]
    _refused(args, "holds multi-turn trajectories but no max_model_len")


@pytest.mark.parametrize(
    "option", [["--tool-latency-s", "2"], ["--tool-workers", "4"], ["--tool-latency-scale", "3"]]
)
def test_multi_turn_options_on_a_single_turn_trace_are_refused(tmp_path: Path, small_trace_path: Path, option) -> None:  # noqa: ANN001
    _refused([*_small_run(small_trace_path, tmp_path / "run"), *option], "applies to multi-turn traces only")
    assert not (tmp_path / "run").exists()


# tracebacks


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compare", "--policies", "sync", "--max-steps", "1", "--plot", "OUT/p.xyz"], "cannot write 'xyz'"),
        (["compare", "--policies", "sync", "--max-steps", "1", "--plot", "OUT/p"], "has no suffix"),
        (["plan", "--target-epoch-hours", "3", "--plot", "OUT/p.docx"], "cannot write 'docx'"),
        (["trace", "inspect", "TRACE", "--plot", "OUT/cdf"], "has no suffix"),
    ],
)
def test_a_plot_format_matplotlib_cannot_write_is_refused_before_any_work(
    tmp_path: Path, small_trace_path: Path, args: list[str], message: str
) -> None:
    args = [a.replace("OUT", str(tmp_path)).replace("TRACE", str(small_trace_path)) for a in args]
    t0 = time.perf_counter()
    _refused(args, message)
    assert time.perf_counter() - t0 < 10  # plan's search and compare's policies never started
    assert list(tmp_path.iterdir()) == [small_trace_path] or small_trace_path.parent != tmp_path


def _turn_log(tmp_path: Path, **change: object) -> Path:
    log = tmp_path / "log"
    log.mkdir()
    rows = []
    for sample in (0, 1):
        row = {"step": 0, "prompt_len": 50, "max_response_len": 500, "max_model_len": 2000, "prompt_group_id": 0,
               "sample_id": sample, "finish_reason": "stop", "validate": False,
               "turns": [{"turn": 0, "prompt_tokens": 50, "cached_tokens": 0, "completion_tokens": 10,
                          "finish_reason": "tool_calls", "engine_latency_s": 1.0},
                         {"turn": 1, "prompt_tokens": 100, "cached_tokens": 0, "completion_tokens": 20,
                          "finish_reason": "stop", "engine_latency_s": 1.0}],
               "tool_calls": [{"turn": 0, "tool_name": "search", "latency_s": 0.2, "append_len": 40}]}  # fmt: skip
        rows.append(json.dumps({**row, **change} if sample == 0 else row))
    (log / "multiturn_workload_step_0.jsonl").write_text("\n".join(rows).replace("Infinity", "1e400") + "\n")
    return log


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tool_calls": "search"}, "'tool_calls' must be a list of objects"),
        ({"turns": ["a", "b"]}, "'turns' must be a list of objects"),
        ({"prompt_len": 10**30}, "'prompt_len' must be an integer of at most"),
        ({"prompt_len": float("inf")}, "'prompt_len' must be an integer of at most"),
        ({"tool_calls": [{"turn": 0, "latency_s": -1.0}]}, "multiturn_workload_step_0.jsonl:1: 'latency_s' must be"),
    ],
)
def test_malformed_multi_turn_log_fields_name_their_line(tmp_path: Path, change: dict, message: str) -> None:
    out = tmp_path / "t.parquet"
    _refused(["trace", "import", str(_turn_log(tmp_path, **change)), "-o", str(out), "--model", "m"], message)
    assert not out.exists()


USER_POLICIES = '''
class NotAnAction:
    def on_step_start(self, view):
        return [42]
    def on_event(self, event, view):
        return []

class LaunchesNothing:
    def on_step_start(self, view):
        return []
    def on_event(self, event, view):
        return []
'''


@pytest.mark.parametrize(
    ("cls", "message"),
    [("NotAnAction", "answered 42, which is not an action"), ("LaunchesNothing", "launched nothing")],
)
def test_a_user_policy_that_misbehaves_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_trace_path: Path, cls: str, message: str
) -> None:
    (tmp_path / "my_policies.py").write_text(USER_POLICIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    _refused([*_small_run(small_trace_path, tmp_path / "run"), "--policy", f"my_policies:{cls}"], message)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["trace", "synth", "-o", "OUT/t.parquet", "--num-prompts", "100000000000"], "too large"),
        (["trace", "synth", "-o", "OUT/t.parquet", "--num-prompts", "1000", "--samples-per-prompt", "100000000"],
         "too large"),
        (["plan", "--target-epoch-hours", "3", "--gpus", "8..1000000000"], "at most 16,384 GPUs"),
    ],
)
def test_sizes_that_cannot_fit_are_one_sentence(tmp_path: Path, args: list[str], message: str) -> None:
    _refused([a.replace("OUT", str(tmp_path)) for a in args], message)


# hangs


@pytest.mark.parametrize("gpus", ["1000000", "4000000000"])
def test_millions_of_gpus_are_refused_at_once(tmp_path: Path, small_trace_path: Path, gpus: str) -> None:
    t0 = time.perf_counter()
    args = _small_run(small_trace_path, tmp_path / "run")
    _refused([*args[:3], *args[5:], "--gpus", gpus], "at most 16,384 GPUs")
    _refused(["compare", "--trace", str(small_trace_path), "--gpus", gpus, "--max-steps", "1"], "at most 16,384 GPUs")
    assert time.perf_counter() - t0 < 10


def test_16384_gpus_simulate(tmp_path: Path, small_trace_path: Path) -> None:
    args = _small_run(small_trace_path, tmp_path / "run")
    r = runner.invoke(app, [*args[:3], *args[5:], "--gpus", "16384"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["num_instances"] == 4096


# unclear


@pytest.mark.parametrize(
    ("value", "got"), [("NaN", "nan"), ('"fast"', "'fast'"), ("1e999", "inf")]
)
def test_a_bad_terms_file_is_named_with_its_term(tmp_path: Path, small_trace_path: Path, value: str, got: str) -> None:
    message = f"'iteration_overhead_s' must be a number >= 0, got {got}"
    terms = tmp_path / "terms.json"
    terms.write_text('{"terms": {"iteration_overhead_s": ' + value + "}}")
    args = _small_run(small_trace_path, tmp_path / "run")
    r = runner.invoke(app, [*args, "--model", "qwen2.5-7b", "--gpu", "h100", "--terms", str(terms)])
    assert r.exit_code == 2 and f"{terms}: {message}" in r.stderr, r.stderr


def test_a_model_config_given_as_a_profile_says_so(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(MODEL_CFG))
    _refused(["profile", "show", str(cfg)], "is a model config, not a profile: derive one with rlsim profile derive")
    _refused(_small_run(cfg, tmp_path / "r")[:1] + ["--profile", str(cfg), "--max-steps", "1"], "is a model config")


# inconsistent


def test_profile_derive_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    out = tmp_path / "mine.json"
    out.write_text('{"mine": true}')
    args = ["profile", "derive", "--model", "qwen2.5-7b", "--gpu", "h100", "-o", str(out)]
    _refused(args, "already exists; pass --force to overwrite it")
    assert out.read_text() == '{"mine": true}'
    r = runner.invoke(app, [*args, "--force"])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["name"] == "h100-qwen2.5-7b-tp1"


def test_a_killed_simulate_leaves_no_temporary_directory(tmp_path: Path, small_trace_path: Path) -> None:
    """A writer killed outright (SIGKILL: nothing of it runs again) leaves its temporary directory;
    the next run into the same folder removes it. One stopped by SIGTERM removes its own."""
    out = tmp_path / "run"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".run.{dead.pid}.abc123.tmp"
    stale.mkdir()
    (stale / "requests.parquet").write_bytes(b"x" * 1000)
    r = runner.invoke(app, _small_run(small_trace_path, out))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    args = [sys.executable, "-m", "rlsim.cli", *_small_run(small_trace_path, out)[:-2], "--max-steps", "40",
            "-o", str(out), "--force"]  # fmt: skip
    for _ in range(20):  # until a SIGTERM lands while the run directory is being written
        proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = False
        while proc.poll() is None and not seen:
            seen = any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
        if seen:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        if seen and proc.returncode != 0:
            break
        seen = False  # (a run that ended between the sighting and the signal was not stopped: again)
    assert seen, "no run was caught writing"
    assert proc.returncode != 0 and "Traceback" not in err, err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# ---- nothing the user gave silently dropped or lost ------------------------------------------
# Strict metrics logs, outputs claimed before work starts, and the rough edges a new user meets.

from rlsim.real.validate_verl import read_verl_metrics  # noqa: E402

from .recorded_run import RUN, RUN_CONFIG  # noqa: E402


def _log(tmp_path: Path, lines: list, end: str = "\n") -> Path:
    """A veRL file-logger metrics file of these lines (dicts as JSON, strings as they are)."""
    path = tmp_path / "metrics.jsonl"
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    path.write_text(text + end)
    return path


def _step(step: int, gen: object = 10.0, **more: object) -> dict:
    return {"step": step, "data": {"timing_s/gen": gen, "timing_s/step": 20.0, "response_length/mean": 300.0, **more}}


def _validate_refused(tmp_path: Path, metrics: Path, message: str) -> None:
    """(validate first says on stderr what it read from the config: the error is its last line, one sentence)"""
    config = tmp_path / "run.overrides"
    config.write_text(RUN_CONFIG)
    r = runner.invoke(app, ["validate", "--from", f"verl:{config}", "--metrics", str(metrics), "--profile",
                            str(RUN / "profile.json")])  # fmt: skip
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, r.stderr


def test_a_metrics_line_that_does_not_parse_is_refused_by_its_line(tmp_path: Path) -> None:
    metrics = _log(tmp_path, [_step(1), _step(2), '{"step": 3, "data": {"timing_s/gen": 1', _step(4)])
    _validate_refused(tmp_path, metrics, f"{metrics}:3: not a JSON line")
    with pytest.raises(RlsimError, match=r"metrics.jsonl:3: not a JSON line"):
        read_verl_metrics(metrics)


def test_a_last_line_without_its_newline_is_named_and_skipped(tmp_path: Path) -> None:
    """A run still writing: its last line, cut short with no newline, is skipped and the output says so;
    cut short with its newline, it is refused like any line."""
    metrics = _log(tmp_path, [_step(1), _step(2), '{"step": 3, "data": {"timing_s/g'], end="")
    frame = read_verl_metrics(metrics)
    assert frame["step"].tolist() == [1, 2]
    assert any("line 3" in n and "no newline" in n and "skipped" in n for n in frame.attrs["notes"]), frame.attrs
    with pytest.raises(RlsimError, match=":3: not a JSON line"):
        read_verl_metrics(_log(tmp_path, [_step(1), _step(2), '{"step": 3, "data": {"timing_s/g']))


def test_one_metric_with_two_values_at_one_step_is_refused_naming_both_lines(tmp_path: Path) -> None:
    metrics = _log(tmp_path, [_step(1, gen=10.0 + i) for i in range(8)])
    _validate_refused(tmp_path, metrics, "step 1: timing_s/gen is 10.0 on line 1 and 11.0 on line 2")
    same = read_verl_metrics(_log(tmp_path, [_step(1), _step(1), {"step": 1, "data": {"actor/lr": 1e-6}}]))
    assert same["step"].tolist() == [1] and same["actor/lr"].tolist() == [1e-6]  # other metrics merge


def test_a_resumed_runs_later_block_wins_and_the_output_says_so(tmp_path: Path) -> None:
    lines = [_step(s, gen=float(s)) for s in range(1, 6)] + [_step(s, gen=100.0 + s) for s in range(3, 9)]
    frame = read_verl_metrics(_log(tmp_path, lines))
    assert frame["step"].tolist() == list(range(1, 9))
    assert frame["timing_s/gen"].tolist() == [1.0, 2.0, 103.0, 104.0, 105.0, 106.0, 107.0, 108.0]
    assert any("steps 3-5 logged again from line 6" in n for n in frame.attrs["notes"]), frame.attrs


@pytest.mark.parametrize(
    ("gen", "message"),
    [(-5.0, "step 2: timing_s/gen is -5.0"), (float("nan"), "step 2: timing_s/gen is nan"),
     ("fast", "step 2: timing_s/gen is 'fast'"), (float("inf"), "step 2: timing_s/gen is inf")],
)  # fmt: skip
def test_a_negative_or_non_finite_timing_is_refused(tmp_path: Path, gen: object, message: str) -> None:
    metrics = _log(tmp_path, [_step(1), _step(2, gen=gen), _step(3)])
    _validate_refused(tmp_path, metrics, message)
    console = tmp_path / "console.log"
    console.write_text(f"step:1 - timing_s/gen:10.0\nINFO other\nstep:2 - timing_s/gen:{gen}\n")
    with pytest.raises(RlsimError, match=message):
        read_verl_metrics(console)


def test_console_lines_that_are_not_metrics_are_skipped(tmp_path: Path) -> None:
    console = tmp_path / "console.log"
    console.write_text("{'a': 1}\nINFO starting\nstep:1 - timing_s/gen:10.0 - timing_s/step:20.0\nwarning x\n")
    assert read_verl_metrics(console)["timing_s/gen"].tolist() == [10.0]


@pytest.mark.parametrize("body", ['{"terms": {}}', '{"terms": {}, "fitted_on": "nothing"}'])
def test_a_terms_file_without_terms_is_refused(tmp_path: Path, small_trace_path: Path, body: str) -> None:
    terms = tmp_path / "terms.json"
    terms.write_text(body)
    args = _small_run(small_trace_path, tmp_path / "run")
    _refused([*args, "--model", "qwen2.5-7b", "--gpu", "h100", "--terms", str(terms)],
             f"{terms}: its 'terms' object names no term")  # fmt: skip


PLAN = ["plan", "--gpu-budget", "8", "--model", "qwen2.5-7b", "--gpu", "h100", "--gpus", "8",
        "--policies", "sync", "--steps", "1", "--min-steps", "1"]  # fmt: skip


def test_plan_emit_never_overwrites_without_force(tmp_path: Path) -> None:
    mine = tmp_path / "mine.overrides"
    mine.write_text("my own overrides\n")
    _refused([*PLAN, "--emit", f"verl:{mine}"], f"--emit {mine} already exists; pass --force to overwrite it")
    assert mine.read_text() == "my own overrides\n"
    r = runner.invoke(app, [*PLAN, "--emit", f"verl:{mine}", "--force", "--cache", str(tmp_path / "c.jsonl")])
    assert r.exit_code == 0, r.output
    assert "actor_rollout_ref" in mine.read_text()


def test_two_simulates_into_one_new_folder_never_both_succeed(tmp_path: Path, small_trace_path: Path) -> None:
    """Started together into one new -o folder: one writes it, the other is refused (claimed by the
    first, naming its pid, or already holding the first's files); never both exit 0."""
    out = tmp_path / "new"
    args = [sys.executable, "-m", "rlsim.cli", *_small_run(small_trace_path, out)[:-4], "--max-steps", "2",
            "-o", str(out)]  # fmt: skip
    procs = [subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]  # fmt: skip
    done = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert sorted(rc for rc, _ in done) == [0, 2], done
    err = next(e for rc, e in done if rc == 2)
    assert "is claimed by another rlsim command (pid " in err or "already holds files" in err, err
    assert (out / "summary.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # the claim released


def test_a_claimed_output_is_refused_naming_its_holder(tmp_path: Path, small_trace_path: Path) -> None:
    """Each command that writes claims its output before any work: a held claim refuses it, naming the
    holder's pid; a released one (a killed holder's too) does not."""
    from rlsim.claim import claimed

    out = tmp_path / "run"
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"fixed": SMALL, "grid": {"gpus": [4]}}))
    emit, png, sweep = tmp_path / "best.overrides", tmp_path / "c.png", tmp_path / "s.parquet"
    cases = [
        (out, _small_run(small_trace_path, out)),
        (png, ["compare", "--trace", str(small_trace_path), "--gpus", "4", "--max-steps", "1", "--policies", "sync",
               "--plot", str(png)]),
        (sweep, ["sweep", str(grid), "--out", str(sweep), "--workers", "1"]),
        (emit, [*PLAN, "--emit", f"verl:{emit}"]),
        (out, ["run", "--real", "--model", str(tmp_path), "--trace", str(small_trace_path), "-o", str(out)]),
    ]  # fmt: skip
    for path, args in cases:
        with claimed(path, "--out"):
            _refused(args, f"is claimed by another rlsim command (pid {os.getpid()})")
        assert not path.exists() or path.is_dir() and not any(path.iterdir()), path
    # a killed holder: the kernel releases its lock; its claim file stays until the next claim takes it over
    hold = ("import sys, time; from pathlib import Path; from rlsim.claim import claimed; "
            "c = claimed(Path(sys.argv[1]), '--out'); c.__enter__(); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    _refused(_small_run(small_trace_path, out), f"(pid {holder.pid})")
    holder.kill()
    holder.wait()
    r = runner.invoke(app, _small_run(small_trace_path, out))
    assert r.exit_code == 0, r.output
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_compare_prints_a_line_per_policy_when_not_on_a_terminal(small_trace_path: Path) -> None:
    r = runner.invoke(app, ["compare", "--trace", str(small_trace_path), "--gpus", "4", "--max-steps", "1",
                            "--policies", "sync,rollpacker"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "the first run loading the simulator too" in r.stderr.splitlines()[0], r.stderr
    done = [line.split(":")[0] for line in r.stderr.splitlines() if ": simulated (" in line]  # in the order they end
    assert sorted(done) == ["rollpacker", "sync"] and "simulated (2/2, " in r.stderr, r.stderr


def test_a_missing_real_extra_is_one_sentence(tmp_path: Path) -> None:
    """The README's first real-mode command without the real extra (torch hidden from it)."""
    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['tiny_model', '--out', sys.argv[1]]; "
            "runpy.run_module('calibrate.tiny_model', run_name='__main__')")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "pip install -e '.[real]'" in r.stderr, r.stderr


def test_a_derived_profile_is_shown_by_name_not_by_its_cache_path(tmp_path: Path, small_trace_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {"RLSIM_CACHE_DIR": str(cache)}
    r = runner.invoke(app, [*_small_run(small_trace_path, tmp_path / "run"), "--model", "qwen2.5-7b", "--gpu", "h100"],
                      env=env)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert str(cache) not in r.output and "h100-qwen2.5-7b-tp1" in r.stdout, r.output
    r = runner.invoke(app, ["compare", "--trace", str(small_trace_path), "--gpus", "4", "--max-steps", "1",
                            "--policies", "sync", "--model", "qwen2.5-7b", "--gpu", "h100"], env=env)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert str(cache) not in r.output, r.output
    assert "4 GPUs, h100-qwen2.5-7b-tp1, colocated" in " ".join(r.stdout.split()), r.stdout  # no word cut


def test_the_timeline_title_fits_its_figure(small_trace: Trace) -> None:
    from rlsim.config import RLConfig
    from rlsim.report import timeline_figure
    from rlsim.sim.simulate import simulate

    res = simulate(small_trace, "sync", rl=RLConfig(prompts_per_step=16, samples_per_prompt=4, max_steps=1))
    res = dataclasses.replace(res, policy="sortedrl(" + ",".join(f"knob_{i}={i}" for i in range(30)) + ")")
    fig = timeline_figure(res)
    fig.canvas.draw()
    box, title = fig.bbox, fig.axes[0].title.get_window_extent()
    assert box.x0 <= title.x0 and title.x1 <= box.x1 and title.y1 <= box.y1, (box, title)


@pytest.mark.parametrize("span", [(60.0, 140.0), (5.0, 5000.0), (150.0, 900.0)])
def test_plan_png_labels_its_x_axis_above_100(span: tuple[float, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlsim.plan.report import plan_figure

    lo, hi = span
    hours = (lo, (lo * hi) ** 0.5, hi)
    rows = [{"policy": "sync", "gpu_hours": g, "epoch_hours": 1.0 + i} for i, g in enumerate(hours)]
    result = {"rows": rows, "pareto": rows, "answers": [], "profile": "h100-qwen2.5-7b",
              "objective": {"target_epoch_hours": None, "gpu_budget": 8}}  # fmt: skip
    fig = plan_figure(result)
    fig.canvas.draw()
    ax = fig.axes[0]
    x0, x1 = ax.get_xlim()
    labels = [t for t in ax.get_xticklabels(which="both") if t.get_text() and x0 <= t.get_position()[0] <= x1]
    above = [t.get_text() for t in labels if t.get_position()[0] > 100]
    assert above if hi > 100 else True, [t.get_text() for t in labels]
    assert 3 <= len(labels) <= 12, [t.get_text() for t in labels]
    boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: b.x0)
    assert all(a.x1 <= b.x0 for a, b in zip(boxes[:-1], boxes[1:], strict=True)), "tick labels overlap"
    plt.close(fig)


def test_one_of_a_thing_is_singular(tmp_path: Path, small_trace_path: Path) -> None:
    from rlsim.text import counted

    assert [counted(n, "step") for n in (0, 1, 2, 1024)] == ["0 steps", "1 step", "2 steps", "1,024 steps"]
    assert counted(1, "GPU") == "1 GPU" and counted(2, "policy", "policies") == "2 policies"
    r = runner.invoke(app, ["simulate", "--trace", str(small_trace_path), "--gpus", "1", "--max-steps", "1",
                            "--model", "qwen2.5-7b", "--gpu", "h100", "-o", str(tmp_path / "run")])  # fmt: skip
    assert r.exit_code == 0, r.output
    words = " ".join(r.stdout.split())
    assert "1 GPU," in words and "over 1 step" in words and "1 GPUs" not in words and "1 steps" not in words, words
