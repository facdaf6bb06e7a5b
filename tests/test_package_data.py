"""`python -m rlsim.package_data`: one command writes every file of package data that code builds,
and its `--check` (run by CI) names each part whose committed files are not what it builds now.
The shipped profiles' and the compiled core's checks are tested beside their data
(`test_iteration_model.py`, `test_shipped_core.py`); here the bands and NeMo RL's fitted terms,
and the command itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlsim.errors import RlsimError
from rlsim.package_data import bands, nemo_rl, terms

REPO = Path(__file__).resolve().parents[1]


def _check(*parts: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlsim.package_data", "--check", *parts], cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_the_committed_bands_and_terms_are_current() -> None:
    out = _check("bands", "terms")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == ["bands: current", "terms: current"]


def test_the_terms_check_finds_other_rows_another_chosen_set_and_a_missing_file(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """The terms record the digest of what they were fitted on: a row's published step moved, or
    another set chosen to ship, and the committed terms are not the fit of these inputs."""
    assert terms.stale() == []
    rows = tmp_path / "rows.csv"
    text = nemo_rl.ROWS.read_text()
    header, first, rest = text.split("\n", 2)
    cells = first.split(",")
    step = header.split(",").index("step_s")
    cells[step] = str(float(cells[step]) + 1)
    rows.write_text("\n".join([header, ",".join(cells), rest]))
    monkeypatch.setattr(nemo_rl, "ROWS", rows)
    found = terms.stale()
    assert len(found) == 1 and "was fitted on inputs" in found[0]
    monkeypatch.undo()

    chosen = json.loads(terms.TERM_SETS_FILE.read_text())
    other = next(name for name in chosen["terms"] if name != chosen["chosen"])
    sets = tmp_path / "term_sets.json"
    sets.write_text(json.dumps({**chosen, "chosen": other}))
    monkeypatch.setattr(terms, "TERM_SETS_FILE", sets)
    assert terms.stale() != []
    monkeypatch.undo()

    monkeypatch.setattr(nemo_rl, "FITTED", tmp_path / "terms_nemo-rl.json")
    assert terms.stale() == ["terms_nemo-rl.json missing"]


def test_a_fit_of_no_term_is_refused_before_it_simulates(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    chosen = json.loads(terms.TERM_SETS_FILE.read_text())
    sets = tmp_path / "term_sets.json"
    sets.write_text(json.dumps({**chosen, "chosen": "derived"}))
    monkeypatch.setattr(terms, "TERM_SETS_FILE", sets)
    with pytest.raises(RlsimError, match="the derived profile ships"):
        terms.build()
    monkeypatch.setattr(terms, "TERM_SETS_FILE", tmp_path / "none.json")
    with pytest.raises(RlsimError, match="--term-sets"):
        terms.inputs_digest()


def test_the_bands_check_finds_a_changed_file(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    copy = tmp_path / "bands.json"
    data = json.loads(bands.BANDS.read_text())
    data["runs"][0]["error_pct"] += 1
    copy.write_text(json.dumps(data, indent=1) + "\n")
    monkeypatch.setattr(bands, "BANDS", copy)
    assert bands.stale() == ["bands.json is not what the accuracy tables give"]
    bands.write()
    assert bands.stale() == [] and copy.read_text() == (REPO / "rlsim" / "bands.json").read_text()
    monkeypatch.setattr(bands, "TRANSFER", tmp_path / "transfer.json")  # the calibrated band's summary
    with pytest.raises(RlsimError, match="doctables.transfer"):
        bands.build()


def test_an_unknown_part_is_one_line_and_exit_2() -> None:
    out = _check("bogus")
    assert out.returncode == 2
    assert out.stderr.strip() == "error: unknown part 'bogus': use profiles, core, bands, terms"
