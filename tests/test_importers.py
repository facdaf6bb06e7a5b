"""Importers of real logs: PolyTrace verl packed lengths (real files) and veRL rollout dumps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.errors import RlsimError
from rlsim.trace.format import load
from rlsim.trace.importers import detect_format, import_polytrace, import_verl
from rlsim.trace.stats import trace_stats
from tests.optional import need

from .conftest import CODER_LOG_DIR, POLYTRACE_DIR


def test_polytrace_import_of_the_real_logs() -> None:
    """The real verl DAPO logs import as 576 prompts x 8 samples with their known statistics."""
    trace = import_polytrace(POLYTRACE_DIR)
    assert trace.meta.source == "real:polytrace/polytrace_verl_dapo_qwen2.5"
    assert trace.num_prompts == 576 and trace.meta.samples_per_prompt == 8
    s = trace_stats(trace).overall
    assert round(s.mean) == 581 and s.p50 == 466 and s.max == 10112
    assert abs(s.within_prompt_cv - 0.548) < 0.001
    assert abs(s.mean_prompt_tokens - 161.1) < 0.1


def test_polytrace_import_through_cli(tmp_path: Path) -> None:
    """`rlsim trace import` auto-detects the format and writes a loadable trace."""
    out = tmp_path / "real.parquet"
    result = CliRunner().invoke(app, ["trace", "import", str(POLYTRACE_DIR), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert load(out).num_prompts == 576
    again = CliRunner().invoke(app, ["trace", "import", str(POLYTRACE_DIR), "-o", str(out)])
    assert again.exit_code == 2 and "already exists" in again.stderr


def _tokenizer_dir(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = "solve x plus one equals two the answer is 1 2 3 so".split()
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    d = tmp_path / "tok"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    return d


def _dump(tmp_path: Path) -> Path:
    d = tmp_path / "rollout_data"
    d.mkdir()
    prompts = {"A": "solve x plus one equals two", "B": "solve x"}
    steps = {1: ["A"], 2: ["B"], 3: ["A"]}
    for step, names in steps.items():
        lines = []
        for name in names:
            for s in range(4):
                out = " ".join(["so"] * (s + 1) + ["the", "answer", "is", "1"])
                lines.append({"input": prompts[name], "output": out, "score": float(s % 2), "step": step})
        (d / f"{step}.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return d


def test_verl_dump_import_counts_tokens_and_tracks_visits(tmp_path: Path) -> None:
    """veRL dumps: token counts from the tokenizer, a repeated prompt becomes epoch 1."""
    trace = import_verl(_dump(tmp_path), _tokenizer_dir(tmp_path), max_response_len=6)
    df = trace.table
    assert trace.meta.output_token_ids == "real"
    assert sorted(df.epoch.unique()) == [0, 1]
    a0 = df[(df.epoch == 0) & (df.prompt_id == 0)]
    assert list(a0.num_prompt_tokens) == [6] * 4
    assert list(a0.num_output_tokens) == [5, 6, 6, 6]  # capped at max_response_len=6
    assert list(a0.finish_reason) == ["stop", "length", "length", "length"]
    assert list(df[df.epoch == 1].prompt_id.unique()) == [0]
    assert df.reward.tolist()[:4] == [0.0, 1.0, 0.0, 1.0]


def test_verl_import_cli_writes_trace(tmp_path: Path) -> None:
    """`rlsim trace import --format verl --tokenizer DIR` round-trips through the loader."""
    out = tmp_path / "v.parquet"
    args = [
        "trace",
        "import",
        str(_dump(tmp_path)),
        "-o",
        str(out),
        "--tokenizer",
        str(_tokenizer_dir(tmp_path)),
        "--max-response-len",
        "100",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    back = load(out)
    assert list(back.table.output_token_ids.iloc[0]) == [13, 7, 8, 9, 10]  # "so the answer is 1"


def test_import_errors_are_one_sentence(tmp_path: Path) -> None:
    """Unknown directory contents, missing tokenizer and broken JSON are clear errors."""
    with pytest.raises(RlsimError, match="neither PolyTrace"):
        detect_format(tmp_path)
    with pytest.raises(RlsimError, match="give --tokenizer"):
        import_verl(_dump(tmp_path), None, 100)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "packed_lengths_step_0.jsonl").write_text("{not json\n")
    result = CliRunner().invoke(app, ["trace", "import", str(bad), "-o", str(tmp_path / "o.parquet")])
    assert result.exit_code == 2 and "is not valid JSON" in result.stderr


def test_coder_log_cap_steps_and_reward_timings_are_read_from_the_data(tmp_path: Path) -> None:
    """The real rLLM DeepCoder log (16,000-token cap, 5 steps x 16 prompts x 8): the run folder is
    found one level down, the cap is inferred from the 15% of responses at exactly 16,000 and
    said, steps and reward timings are kept."""
    out = tmp_path / "coder.parquet"
    result = CliRunner().invoke(app, ["trace", "import", str(CODER_LOG_DIR), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "run folder 20260616_024512" in result.output
    assert "max_response_len 16,000 inferred: 96 responses (15.0%) stop at exactly 16,000" in result.output
    trace = load(out)
    assert trace.meta.max_response_len == 16000 and trace.meta.samples_per_prompt == 8
    s = trace_stats(trace).overall
    assert abs(s.clip_ratio - 0.15) < 1e-9 and s.num_samples == 640
    df = trace.table
    assert sorted(df.step.unique()) == [0, 1, 2, 3, 4]
    assert (df.groupby("step").prompt_id.nunique() == 16).all()
    assert trace.meta.source_params["prompts_per_step"] == 16
    # rank 0's batch of 64 at step 0 took 77.34 s: 1.208 s per sample scored one at a time
    first = df[(df.step == 0) & (df.prompt_id == 0)]
    assert abs(first.reward_time_s.iloc[0] - 77.34310807101429 / 64) < 1e-5
    assert len(trace.meta.source_params["reward_timings"]) == 10


def test_a_given_cap_that_disagrees_with_the_data_is_warned_or_refused(tmp_path: Path) -> None:
    """A cap above the pile-up is kept with a warning (those responses then do not count as
    clipped); a cap below the longest response is one sentence and exit 2."""
    out = tmp_path / "c.parquet"
    result = CliRunner().invoke(
        app, ["trace", "import", str(CODER_LOG_DIR), "-o", str(out), "--max-response-len", "20480"]
    )
    assert result.exit_code == 0, result.output
    assert "warning: 96 responses (15.0%) stop at exactly 16,000 tokens, below the given cap 20,480" in " ".join(
        result.output.split()
    )
    assert trace_stats(load(out)).overall.clip_ratio == 0.0
    low = CliRunner().invoke(
        app, ["trace", "import", str(CODER_LOG_DIR), "-o", str(tmp_path / "d.parquet"), "--max-response-len", "8000"]
    )
    assert low.exit_code == 2 and "responses are longer than --max-response-len 8,000" in low.stderr


def test_no_pile_up_means_an_assumed_cap_that_is_said(tmp_path: Path) -> None:
    """The verl DAPO log peaks at 10,112 once: no cap is in the data, so one is assumed and said."""
    from rlsim.trace.importers import import_logs

    imported = import_logs(POLYTRACE_DIR)
    assert imported.trace.meta.max_response_len == 16384
    assert any("16,384 assumed" in n and "pass --max-response-len" in n for n in imported.notes)
    assert imported.trace.meta.model == "unknown"


def test_wrong_format_and_several_runs_are_one_sentence(tmp_path: Path) -> None:
    """--format verl on PolyTrace files says what the files are instead of asking for a tokenizer;
    a folder holding two runs names them."""
    result = CliRunner().invoke(
        app, ["trace", "import", str(POLYTRACE_DIR), "-o", str(tmp_path / "x.parquet"), "--format", "verl"]
    )
    assert result.exit_code == 2
    assert "holds PolyTrace packed_lengths_step_*.jsonl logs, not veRL rollout dumps" in result.stderr
    assert "tokenizer" not in result.stderr
    runs = tmp_path / "packed_length_log"
    for name in ("a", "b"):
        (runs / name).mkdir(parents=True)
        (runs / name / "packed_lengths_step_0.jsonl").write_text(
            json.dumps({"step": 0, "input": 10, "output": [5, 6], "validate": False}) + "\n"
        )
    two = CliRunner().invoke(app, ["trace", "import", str(runs), "-o", str(tmp_path / "y.parquet")])
    assert two.exit_code == 2 and "holds 2 runs (a, b): give the folder of one" in two.stderr


def test_verl_dump_with_gts_and_extra_fields_infers_its_cap(tmp_path: Path) -> None:
    """A dump as current veRL writes it (gts, score, step and extra reward fields) with no cap
    given: the cap comes from the responses piled up at one length."""
    d = tmp_path / "rollout_data_dir"
    d.mkdir()
    lines = []
    for p in range(6):
        for s in range(4):
            words = 3 + p + s if s < 3 else 12  # the last sample of every group hits the 12-token cap
            out = " ".join(["so"] * words)
            line = {"input": f"solve x plus {p}", "output": out, "gts": "2", "score": 1.0, "step": 1, "acc": True}
            lines.append(line)
    (d / "1.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    words = "solve x plus 0 1 2 3 4 5 so".split()
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    from rlsim.trace.importers import import_logs

    imported = import_logs(d, tokenizer=tmp_path / "tokenizer.json")
    trace = imported.trace
    assert trace.meta.max_response_len == 12 and trace.num_prompts == 6
    assert (trace.table.finish_reason == "length").sum() == 6
    assert "reward" in trace.table.columns and (trace.table.step == 1).all()


def _slime_dump(d: Path) -> None:
    """Two rollouts written as slime's `save_debug_rollout_data` writes them (torch.save of a dict
    of Sample.to_dict() values), plus an evaluation dump that must be skipped."""
    torch = need("torch", "slime's dumps are torch files")
    d.mkdir()
    prompts = {0: "What is 1+1?", 1: [{"role": "user", "content": "What is 2+2?"}]}
    for rid, groups in ((0, (0, 1)), (1, (0,))):
        samples = []
        for g in groups:
            for i in range(3):
                length = 64 if i == 2 else 10 + 5 * i + g
                samples.append(
                    {
                        "group_index": g, "index": g * 3 + i, "prompt": prompts[g],
                        "tokens": list(range(7 + g)) + [100 + k for k in range(length)],
                        "response": "x" * length, "response_length": length, "label": "2",
                        "reward": {"acc": float(i % 2)}, "loss_mask": [1] * length,
                        "status": "truncated" if i == 2 else "completed", "metadata": {},
                    }
                )  # fmt: skip
        samples.append({**samples[0], "status": "aborted", "index": 99})
        torch.save({"rollout_id": rid, "samples": samples, "metadata": {}}, d / f"rollout_data_{rid}.pt")
    torch.save({"rollout_id": 0, "samples": []}, d / "rollout_data_eval_0.pt")


def test_slime_rollout_dumps_import_with_real_tokens_and_truncation(tmp_path: Path) -> None:
    """slime dumps: prompt tokens = tokens - response_length, the response's own token ids, the
    cap from the samples slime marked truncated, a prompt seen again is its next visit."""
    d = tmp_path / "debug"
    _slime_dump(d)
    out = tmp_path / "s.parquet"
    result = CliRunner().invoke(app, ["trace", "import", str(d), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "aborted or failed samples skipped" in result.output
    trace = load(out)
    df = trace.table
    assert trace.meta.source == "real:slime/debug" and trace.meta.output_token_ids == "real"
    assert trace.meta.max_response_len == 64 and trace.meta.samples_per_prompt == 3
    assert sorted(df.epoch.unique()) == [0, 1] and df[df.epoch == 1].prompt_id.unique().tolist() == [0]
    g0 = df[(df.epoch == 0) & (df.prompt_id == 0)]
    assert g0.num_prompt_tokens.tolist() == [7, 7, 7] and g0.num_output_tokens.tolist() == [10, 15, 64]
    assert list(g0.output_token_ids.iloc[0]) == list(range(100, 110))
    assert g0.finish_reason.tolist() == ["stop", "stop", "length"] and g0.reward.tolist() == [0.0, 1.0, 0.0]


def test_slime_format_asked_of_other_files_is_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "dumps"
    bad.mkdir()
    (bad / "rollout_0.pt").write_bytes(b"not a torch file")
    need("torch", "slime's dumps are torch files")
    result = CliRunner().invoke(app, ["trace", "import", str(bad), "-o", str(tmp_path / "o.parquet")])
    assert result.exit_code == 2 and "is not a readable slime rollout dump" in result.stderr


def test_a_real_log_replays_in_its_own_step_order(tmp_path: Path) -> None:
    """With the `step` column the dataloader hands out the log's step k as step k; compare and
    simulate default to the log's own P0, R0, cap and epochs, and show RollPacker's reused samples."""
    from rlsim.config import ClusterConfig, RLConfig
    from rlsim.sim.simulate import simulate
    from rlsim.trace.importers import import_logs

    trace = import_logs(CODER_LOG_DIR).trace
    rl = RLConfig(prompts_per_step=16, samples_per_prompt=8, epochs=1, max_response_len=16000)
    res = simulate(trace, "sync", ClusterConfig(num_gpus=8, profile="h100-qwen2.5-14b-tp2"), rl)
    req = res.requests
    logged = trace.table.groupby("prompt_id").step.first()
    assert (req.step.to_numpy() == logged.loc[req.prompt_id].to_numpy()).all()
    path = tmp_path / "coder.parquet"
    from rlsim.trace.format import save

    save(trace, path)
    out = CliRunner().invoke(
        app,
        ["compare", "--trace", str(path), "--policies", "sync,rollpacker", "--gpus", "8",
         "--profile", "h100-qwen2.5-14b-tp2", "--workers", "1"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "P0=16 R0=8 max_len=16000" in text and "reused" in text
