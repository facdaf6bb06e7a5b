"""Importers of real logs: PolyTrace verl packed lengths (real files) and veRL rollout dumps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsim.cli import app
from rlsim.errors import RlsimError
from rlsim.importers import detect_format, import_polytrace, import_verl
from rlsim.stats import trace_stats
from rlsim.trace import load

from .conftest import POLYTRACE_DIR


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
