"""The tables of the README and of docs/ are their scripts' output: the table scripts (`doctables/`,
which compute from the code and committed data) are re-run and each table between its markers must
equal what the script prints now (`--markdown`), so a table cannot drift from the code that
produces it. CI re-runs those that finish in a minute or two. Those that take minutes are checks
too long for CI (`@pytest.mark.long`, run by `.ci/long`): the scripts in `LONG` whole, and the two
longest, `SAMPLED`, whole too and on a sample: the `rlsim compare` tables (eight minutes of
processor time) on sync and a few of their policies (two and a half minutes), whose rows and band
lines must be the table's own, row for row (a policy's row depends on no other policy but sync's);
the transfer tables (four and a half minutes) at the stand-in's lengths alone, whose
rows but their last column (the errors at lengths 25% shorter and longer) must be the table's, as
must the figures `published_runs/transfer.json` ships, and NeMo RL's rows whole.
A script writes its own table with `--readme`, into whichever file holds its markers. The
benchmarks (`benchmarks/`) measure: their timing tables are not deterministic and say the machine
they ran on, and the parity tables' rows are checked in `tests/test_scheduler_parity.py` and
`tests/test_sglang_parity.py` (the subset CI runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlsim.package_data.markers import README, documents, holders, read_table, tables_in, write_table

REPO = Path(__file__).resolve().parents[1]

# table script (doctables/) -> the README tables it writes
DETERMINISTIC = {
    "profile_table": ["profile_table"],
    "derive_table": ["derived_profiles", "derive_checks"],
    "paper_checks": ["paper_checks"],
    "plan_table": ["plan_example", "plan_async"],
    "fit_workload": ["fit_coder_metrics", "fit_coder_speedups"],
    "recorded_runs": ["recorded_runs"],
    "published_runs": ["published_runs", "published_async", "published_sensitivity", "term_sets", "accuracy_summary"],
    "error_bands": ["error_bands", "ratio_bands"],
    "release_spread": ["release_spread"],
    "verl_fully_async": ["verl_fully_async"],
    "verl_phases": ["verl_phases", "verl_weight_sync"],
    "multi_turn": ["search_r1_fit", "search_r1_sim", "tool_latency_sweep", "search_r1_compare", "search_r1_engines"],
    "policy_table": ["policy_knobs"],
    "formats_table": ["model_config_fields", "gpu_fields"],
}
# the scripts above that take minutes (a planner's search, a grid of simulations): re-run whole only among the checks
# too long for CI (`@pytest.mark.long`, RLSIM_LONG_CHECKS=1)
LONG = ("plan_table", "paper_checks", "fit_workload", "multi_turn")
# table script -> its tables, re-run in CI on a sample (whole among the long checks): the transfer tables at the
# stand-in's lengths alone (a third of the calibrations) and the NeMo RL rows whole; each compare table on sync and
# these policies (partial rollout, history-based speculation, fully_async's staleness bound; None: all of them)
SAMPLED = {
    "transfer": ["transfer", "transfer_ratios", "transfer_summary", "transfer_nemo_rl"],
    "compare_table": {"compare_default": "sync,async_partial,histopipe+histospec",
                      "compare_dynamic_sampling": None,  # (every policy: half a minute)
                      "compare_async": "sync,fully_async(staleness_threshold=0.1)"},
}  # fmt: skip
# timing benchmarks (benchmarks/): they write their tables (`--readme`) with the machine and its load; not re-run
TIMING = {
    "simulate_epoch": ["sync_baseline", "simulator_speed"],
    "compiled_core": ["compiled_core"],
    "engine_floor": ["engine_floor"],
    "first_run": ["first_run"],
    "validate_real": ["calibration_figures", "validate_real", "validate_real_profiles"],
    "predict_real": ["predict_real"],
    "validate_train": ["train_tiny", "validate_train"],
    "engine_speed": ["engine_speed"],
    "train_controls": ["train_controls"],
    "dp_attention": ["dp_attention"],
}
# parity benchmarks (benchmarks/): checked row by row in tests/test_scheduler_parity.py, and a subset in
# tests/test_sglang_parity.py
OTHER = {"scheduler_parity": ["scheduler_parity"], "sglang_parity": ["sglang_parity"]}
# table scripts (doctables/), deterministic but minutes long under SimEngine (SGLang's rules): written with
# --readme, not re-run here
SLOW = {"sglang_setups": ["sglang_setups"], "compare_engines": ["compare_engines"]}
# tables written by hand: reference, not measurement (their header lines; among them the README's
# statement of what was fitted on what, and the records' columns in docs/architecture.md)
REFERENCE = ("| vLLM behaviour | rlsim | bound |", "| policy | paper | what it does |", "| column | type | meaning |",
             "| figure | fitted on | role |", "| column | holds |", "| rule | rlsim | where in sglang 0.5.23 |",
             "| veRL key | rlsim |", "| NeMo RL key | rlsim |", "| commit | change | disclosed in |")


def _markdown(script: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", f"doctables.{script}", "--markdown"], cwd=REPO,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    tables = tables_in(out.stdout)
    assert tables, out.stderr[-2000:]
    return tables


@pytest.mark.parametrize("script", [
    *(pytest.param(s, marks=pytest.mark.long) if s in LONG else s for s in DETERMINISTIC),
    *(pytest.param(s, marks=pytest.mark.long) for s in SAMPLED),
])  # fmt: skip
def test_readme_tables_are_their_scripts_output(script: str) -> None:
    tables = _markdown(script)
    assert sorted(tables) == sorted(DETERMINISTIC.get(script) or SAMPLED[script])
    for name, body in tables.items():
        for path in holders(name):
            assert read_table(name, path).strip() == body.strip(), (
                f"{name} in {path.name}: re-run python -m tables.{script} --readme"
            )


@pytest.mark.long  # (two and a half minutes; the golden comparison, tests/test_golden_compare.py, pins each policy)
@pytest.mark.parametrize("table", list(SAMPLED["compare_table"]))
def test_compare_tables_rows_are_rlsim_compares_on_a_sample_of_their_policies(table: str) -> None:
    """The sampled `rlsim compare` of a table (`doctables/compare_table.py`'s arguments, its policies
    cut to the sample): its header, each of its rows and its band lines are the table's, in the
    table's order, and the sample's every policy has its row."""
    from doctables.compare_table import TABLES
    from policies.registry import split_policies

    args, sample = list(TABLES[table]), SAMPLED["compare_table"][table]
    if sample is not None:
        if "--policies" in args:
            args[args.index("--policies") + 1] = sample
        else:
            args += ["--policies", sample]
    out = subprocess.run([sys.executable, "-m", "rlsim.cli", "compare", "--markdown", *args], cwd=REPO,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    ours, theirs = out.stdout.strip().splitlines(), read_table(table).strip().splitlines()
    rows = [ln for ln in ours if ln.startswith("| ") and not ln.startswith("| policy |")]
    assert len(rows) == len(split_policies(args[args.index("--policies") + 1]))
    assert ours[0] == theirs[0]
    at = [theirs.index(ln) if ln in theirs else -1 for ln in ours if ln]
    assert -1 not in at, [ln for ln in ours if ln and ln not in theirs]
    assert at == sorted(at), "the rows in another order than the table's"


@pytest.mark.long  # (two minutes and a half of NeMo RL recipes and calibrated replays)
def test_transfer_tables_at_the_stand_ins_lengths() -> None:
    """`doctables/transfer.py` at the stand-in's lengths: its tables but the columns and the summary
    rows of other lengths, the shipped `transfer.json`, and the NeMo RL table whole."""
    from doctables import transfer

    data = transfer.build(scales=(1.0,))
    assert transfer.transfer_json(data) == transfer.OUT.read_text(), "re-run python -m doctables.transfer --readme"
    ours = transfer.tables(data) | {"transfer_nemo_rl": transfer.nemo_rl_table(transfer.nemo_rl())}
    assert sorted(ours) == sorted(SAMPLED["transfer"])
    for name, body in ours.items():
        theirs = read_table(name).strip().splitlines()
        if name in ("transfer", "transfer_ratios"):  # (without their last column)
            theirs = [ln.rsplit("|", 2)[0] + "|" for ln in theirs]
        elif name == "transfer_summary":  # (its first row, the stand-in's)
            theirs = theirs[:3]
        assert body.strip().splitlines() == theirs, f"{name}: re-run python -m doctables.transfer --readme"


def test_every_readme_table_is_a_scripts_or_reference() -> None:
    """Every Markdown table in the README and in docs/ sits between the markers of the script
    that writes it, or is one of the hand-written reference tables; each timing table says which
    command wrote it. The scripts that compute lie in doctables/, those that measure in benchmarks/."""
    import re

    texts = [path.read_text() for path in documents()]
    named = [name for text in texts for name in re.findall(r"<!-- table: (\S+) -->", text)]
    groups = (DETERMINISTIC, SAMPLED, TIMING, OTHER, SLOW)
    claimed = [t for group in groups for tables in group.values() for t in tables]
    assert sorted(set(named)) == sorted(claimed)
    where = ((DETERMINISTIC, "doctables"), (SAMPLED, "doctables"), (SLOW, "doctables"), (TIMING, "benchmarks"),
             (OTHER, "benchmarks"))  # fmt: skip
    for group, folder in where:
        assert all((REPO / folder / f"{script}.py").is_file() for script in group), folder
    # a table is on one page of docs/, and the README may show it too
    docs = re.findall(r"<!-- table: (\S+) -->", "".join(texts[1:]))
    assert sorted(docs) == sorted(set(docs)) and set(named) == set(docs), "each table on exactly one docs page"
    for script, tables in TIMING.items():
        for name in tables:
            body = read_table(name)
            assert body.count("\n|") >= 2, f"{name} is empty: run python benchmarks/{script}.py --readme"
            assert f"Written by `python benchmarks/{script}.py" in body, name
    for text in texts:
        loose = re.sub(r"<!-- table: (\S+) -->\n.*?<!-- end table: \1 -->", "", text, flags=re.S).split("\n")
        headers = [ln for i, ln in enumerate(loose) if ln.startswith("|") and not loose[i - 1].startswith("|")]
        assert [h for h in headers if h not in REFERENCE] == [], "a table not written by a script"


def test_a_table_is_replaced_between_its_markers_only(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- table: t -->\n| old |\n<!-- end table: t -->\nafter\n")
    write_table("t", "| new |\n|---|", readme)
    assert readme.read_text() == "intro\n<!-- table: t -->\n| new |\n|---|\n<!-- end table: t -->\nafter\n"
    with pytest.raises(KeyError, match="no table named 'u'"):
        read_table("u", readme)


def test_the_readmes_compare_time_quotes_the_speed_table() -> None:
    """The README's speed line quotes `rlsim compare`'s time, and the load it was measured under,
    from the table `benchmarks/simulate_epoch.py --readme` writes into docs/speed.md."""
    import re

    body = read_table("simulator_speed")
    row = next(line for line in body.splitlines() if line.startswith("| `rlsim compare`"))
    after = row.split("|")[3].strip()
    load = re.search(r"\(load average ([0-9.]+)\)", body).group(1)
    text = " ".join(README.read_text().split())
    assert f"({after} s, measured with the load average at {load})" in text, (after, load)


def test_the_readmes_first_run_quotes_the_first_run_table() -> None:
    """The README's first and second `rlsim compare` of a fresh clone, and their load, are the
    table `benchmarks/first_run.py --readme` writes into docs/speed.md."""
    import re

    body = read_table("first_run")
    row = next(line for line in body.splitlines() if line.startswith("| `rlsim compare`")).split("|")
    first, second = row[2].strip(), row[3].strip()
    load = re.search(r"\(load average ([0-9.]+)\)", body).group(1)
    text = " ".join(README.read_text().split())
    assert f"first `rlsim compare` took {first} s and its second {second} s, side by side (load average {load})" in text


def test_the_engine_floor_benchmark_times_the_core_it_names() -> None:
    """`benchmarks/engine_floor.py` (a timing table, not re-run for its figures) still finds the
    compiled core's entry points it times: run on sync alone, the core's seconds are above zero
    and within `CompiledEngine`'s, which are within the epoch's."""
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "engine_floor.py"), "--policies", "sync",
                          "--markdown"], cwd=REPO, capture_output=True, text=True, timeout=900)  # fmt: skip
    body = tables_in(out.stdout).get("engine_floor")
    assert body, out.stderr[-2000:]
    row = next(line for line in body.splitlines() if line.startswith("| sync |"))
    epoch, core, _, engine, rest = (float(c.strip().rstrip("x")) for c in row.split("|")[2:7])
    assert 0 < core <= engine < epoch and rest > 0, row
    assert "a floor of" in body and "with the engine free" in body


def test_the_readmes_speed_claim_holds_in_the_engine_floor_table() -> None:
    """The README says why two speed targets are out of reach: the driver, the policies and the
    records alone are above both (sync at 3x the heap loop, `rlsim compare` in 15 s), and the
    compiled engine alone above the first. The table `benchmarks/engine_floor.py --readme`
    writes into docs/speed.md must show it."""
    import re

    text = " ".join(README.read_text().split())
    claim = (
        "the driver, the policies and the records alone are above both, and the compiled engine alone above the first"
    )
    assert claim in text
    body = read_table("engine_floor")
    sync = next(line for line in body.splitlines() if line.startswith("| sync |")).split("|")
    core, rest = float(sync[4].strip().rstrip("x")), float(sync[7].strip().rstrip("x"))
    compare_rest = float(re.search(r"([0-9.]+) s with the engine free", body).group(1))
    assert core > 3 and rest > 3 and compare_rest > 15, (core, rest, compare_rest)
