"""Property test of the command line: random values for the options each command declares, and for
the fields of a model's config.json, on a one-step, 8-prompt workload, in process (Typer's runner).
Every case must end in exit 0, or in exit 2 with one line on stderr (`error: ...`); any other
exception, a traceback or a second line fails it, and each case has a deadline.

The options are read from the commands themselves (the parameters of `rlsim compare`,
`rlsim simulate` and `rlsim profile derive`), so an option added later is drawn too. A value is
drawn by the option's type: integers around the edges (0, negative, 2^31, 2^63, 10^30) and small
valid ones; floats with NaN, infinities and negatives; text from the option's own vocabulary
(policy names, placements) or arbitrary; switches on or off. A few options stay fixed: the
workload (trace, steps, prompts per step), what is written (`--out`, `--plot`) and the worker
processes. The default run draws 1,000 derandomized cases (about a minute on a 2-core machine);
`RLSIM_FUZZ_EXAMPLES=20000` draws fresh random ones."""

from __future__ import annotations

import enum
import json
import os
import re
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import typer.main
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.core import TyperOption
from typer.testing import CliRunner

from policies.registry import REGISTRY
from rlsim.cli.app import app
from rlsim.derive.models import CONFIG_FIELDS
from rlsim.trace.format import save
from rlsim.trace.synth import SynthConfig, synthesize

LONG = int(os.environ.get("RLSIM_FUZZ_EXAMPLES", "0"))


def _settings(share: float) -> settings:  # (1,000 examples in all: a minute and a half of CI's two cores)
    return settings(max_examples=LONG or int(1000 * share), deadline=timedelta(seconds=10), derandomize=not LONG,
                    suppress_health_check=list(HealthCheck))  # fmt: skip


# fixed: the workload, what is written, and where it runs
FIXED = {"trace", "max_steps", "prompts_per_step", "out", "plot", "workers", "json_out", "as_json", "markdown",
         "force", "help", "model", "gpu", "profile", "terms", "exact", "seeds"}  # fmt: skip
EDGE_INTS = st.sampled_from([0, -1, -(2**31), 2**31, 2**63, 10**30, 16_385])
INTS = st.one_of(st.integers(1, 64), st.integers(-4, 4), EDGE_INTS)
FLOATS = st.one_of(st.floats(0, 4), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.5, 1.5]))
WORDS = [*REGISTRY, "sync+histospec", "rollpacker(R0=4)", "sortedrl(update_batch=0)", "colocated", "disaggregated",
         "least_loaded", "per_prompt", "fsdp2", "megatron(tp=2)", "bf16", "fp8"]  # fmt: skip
TEXT = st.one_of(st.sampled_from(WORDS), st.text(max_size=16))


ROOT = typer.main.get_command(app)


def _command(*path: str):  # noqa: ANN202 - Typer's command object
    cmd = ROOT
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def _option_value(param: TyperOption) -> st.SearchStrategy[list[str]]:
    """The command-line words that set `param` to a drawn value, by the type it declares."""
    flag = max(param.opts, key=len)
    if param.is_flag:
        words = [[flag]] + ([[max(param.secondary_opts, key=len)]] if param.secondary_opts else [])
        return st.sampled_from(words)
    kind = param.type_descriptor.annotation
    if kind is int:
        values = INTS.map(str)
    elif kind is float:
        values = FLOATS.map(repr)
    elif isinstance(kind, type) and issubclass(kind, enum.Enum):
        values = st.one_of(st.sampled_from([m.value for m in kind]), TEXT)
    else:
        values = TEXT
    return values.map(lambda v: [flag, v])


def _options(cmd) -> st.SearchStrategy[list[str]]:  # noqa: ANN001
    params = [p for p in cmd.params if isinstance(p, TyperOption) and p.name not in FIXED]
    assert len(params) > 10, [p.name for p in params]  # the commands' options, not an empty draw
    return st.lists(st.sampled_from(params), min_size=1, max_size=3, unique_by=lambda p: p.name).flatmap(
        lambda ps: st.tuples(*(_option_value(p) for p in ps)).map(lambda ws: [w for pair in ws for w in pair])
    )


@pytest.fixture(scope="module", autouse=True)
def _built_once():  # noqa: ANN202
    """Typer's runner builds the command tree anew for every case (15-40 ms, most of a refused
    case's time): here it takes the tree built once."""
    import typer.testing

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(typer.testing, "_get_command", lambda a: ROOT if a is app else typer.main.get_command(a))
        yield


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = synthesize(SynthConfig(num_prompts=8, samples_per_prompt=4, epochs=1, seed=3, max_response_len=2048))
    return save(t, tmp_path_factory.mktemp("fuzz") / "t.parquet")


PROGRESS = re.compile(r"^\S+: simulated \(\d+/\d+, ")


def _holds(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    if result.exit_code == 0:
        event("ran")
        return
    event(f"exit {result.exit_code}")
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args, "".join(traceback.format_exception(result.exception))[-3000:]
    )  # fmt: skip
    # (compare off a terminal says on stderr as each policy ends; a later policy's refusal follows those lines)
    lines = [line for line in result.stderr.strip().splitlines() if not PROGRESS.match(line)]
    assert result.exit_code == 2, (args, result.exit_code, result.output[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, (args, lines)


COMPARE = _command("compare")
SIMULATE = _command("simulate")


@_settings(0.6)
@given(data=st.data())
def test_compare_options_are_run_or_refused_in_one_sentence(trace: Path, data: st.DataObject) -> None:
    words = data.draw(_options(COMPARE))
    _holds(["compare", "--trace", str(trace), "--max-steps", "1", "--prompts-per-step", "8", "--workers", "1",
            "--json", "--policies", "sync", *words])  # fmt: skip


@_settings(0.15)
@given(data=st.data())
def test_simulate_options_are_run_or_refused_in_one_sentence(trace: Path, tmp_path_factory, data) -> None:  # noqa: ANN001
    words = data.draw(_options(SIMULATE))
    out = tmp_path_factory.mktemp("run") / "run"
    _holds(["simulate", "--trace", str(trace), "--max-steps", "1", "--prompts-per-step", "8", "-o", str(out), *words])


BASE_CONFIG = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
               "vocab_size": 32000, "intermediate_size": 2816}  # fmt: skip
JSON_VALUES = st.one_of(st.none(), st.booleans(), INTS, FLOATS, st.text(max_size=8),
                        st.lists(st.integers(-2, 64), max_size=3), st.just({}))  # fmt: skip


@_settings(0.25)
@given(fields=st.dictionaries(st.sampled_from([f.name for f in CONFIG_FIELDS]), JSON_VALUES, min_size=1, max_size=3),
       tp=st.sampled_from(["1", "2", "3", "8"]))  # fmt: skip
def test_model_config_fields_derive_or_are_refused_in_one_sentence(tmp_path_factory, fields: dict, tp: str) -> None:  # noqa: ANN001
    cfg = tmp_path_factory.mktemp("model") / "config.json"
    try:
        cfg.write_text(json.dumps({**BASE_CONFIG, **fields}, allow_nan=True))
    except ValueError:  # (an integer past what JSON text holds)
        return
    _holds(["profile", "derive", "--model", str(cfg), "--gpu", "h100", "--tp", tp])


# ---- a veRL metrics log, read strictly (`rlsim.real.validate_verl.read_verl_metrics`) ----------

_GOOD = st.builds(lambda step, gen, lr: ("good", {"step": step, "data": {"timing_s/gen": gen, "actor/lr": lr}}),
                  st.integers(1, 6), st.floats(0, 100, allow_nan=False), st.floats(0, 1))  # fmt: skip
_BAD = st.one_of(
    st.builds(lambda s: {"step": s, "data": {"timing_s/gen": -1.0}}, st.integers(1, 6)),
    st.builds(lambda s, v: {"step": s, "data": {"timing_s/gen": v}}, st.integers(1, 6),
              st.sampled_from([float("nan"), float("inf"), "fast"])),
    st.just('{"step": 2, "data": {"timing_s/gen": 1'),  # cut short
    st.just("not json"),
    st.just('{"data": {"timing_s/gen": 1.0}}'),  # no step
).map(lambda x: ("bad", x))  # fmt: skip


@_settings(0.1)
@given(lines=st.lists(st.one_of(_GOOD, _GOOD, _GOOD, _BAD), min_size=1, max_size=12), newline=st.booleans())
def test_a_metrics_log_is_read_whole_or_refused_in_one_sentence(lines: list, newline: bool, tmp_path_factory) -> None:  # noqa: ANN001
    """Any log of good and bad lines: a frame whose steps are unique and whose timings are finite and
    >= 0, each step's values those of its last block's lines; or one sentence (never another error).
    A log of good lines only is refused only where one metric takes two values at one step."""
    from rlsim.errors import RlsimError
    from rlsim.real.validate_verl import read_verl_metrics

    path = tmp_path_factory.mktemp("log") / "metrics.jsonl"
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for _, x in lines)
    path.write_text(text + ("\n" if newline else ""))
    try:
        frame = read_verl_metrics(path)
    except RlsimError as exc:
        event("refused")
        assert "\n" not in str(exc).strip()
        if all(kind == "good" for kind, _ in lines):
            assert "on line" in str(exc), exc
        return
    event("read")
    assert frame["step"].is_unique and frame["step"].is_monotonic_increasing
    gen = frame["timing_s/gen"].dropna()
    assert ((gen >= 0) & gen.map(lambda v: v == v and v != float("inf"))).all()
    blocks: dict[int, dict] = {}  # the reader's rule restated: a lower step starts a block, which drops those it logs
    last = None
    for _, x in lines:
        if isinstance(x, dict) and "step" in x:
            if last is not None and x["step"] < last:
                blocks = {s: v for s, v in blocks.items() if s < x["step"]}
            last = x["step"]
            blocks.setdefault(x["step"], {}).update(x["data"])
    assert frame["step"].tolist() == sorted(blocks)
    for _, row in frame.iterrows():
        assert row["timing_s/gen"] == blocks[int(row["step"])]["timing_s/gen"]
