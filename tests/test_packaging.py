"""The wheel a plain `pip install .` builds holds exactly the project's tracked files: every module
and every piece of package data under `rlsim/`, `policies/`, `calibrate/` and `traces/` (shipped as
`rlsim._bundled`), and nothing else (no tests, no benchmarks, no stray build output). A package
left out of the wheel once lost the simulator's compiled core to every non-editable install; `.ci/run`
also installs the wheel into a fresh environment and runs the README's main command from outside
the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("rlsim", "policies", "calibrate", "traces")


def _git_files(*paths: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *paths], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def _tracked() -> set[str]:
    """The tracked files the wheel must hold, under the names it installs them as."""
    return {f"rlsim/_bundled/{f[len('traces/') :]}" if f.startswith("traces/") else f for f in _git_files(*SHIPPED)}


def test_the_wheel_holds_every_tracked_file_of_the_packages_and_nothing_else(tmp_path: Path) -> None:
    # built from a copy of the tracked files, so that no stale build/ output of the checkout can
    # stand in for a file the packaging misses; no build isolation: setuptools is here, no registry
    src = tmp_path / "src"
    for f in _git_files("pyproject.toml", "setup.py", "README.md", *SHIPPED):
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(src)], check=True, capture_output=True, cwd=tmp_path)  # fmt: skip
    wheels = list(tmp_path.glob("rlsim-*.whl"))
    assert len(wheels) == 1, wheels
    names = {n for n in zipfile.ZipFile(wheels[0]).namelist() if ".dist-info/" not in n}
    tracked = _tracked()
    assert "rlsim/sim/compiled/engine.py" in tracked and "rlsim/_bundled/math17k.parquet" in tracked
    assert sorted(tracked - names) == [], "tracked files the wheel leaves out"
    assert sorted(names - tracked) == [], "files in the wheel that are not tracked"


def test_ci_runs_the_readmes_test_command() -> None:
    """The README's (and the docs' home page's) second command is the test command `.ci/run` runs."""
    readme = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    install, _, tests = readme[1].partition(" && ")
    assert install == "pip install -e '.[test]'" and tests.startswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci and "pip install -q -e '.[test]'" in ci
    assert readme[1] in (ROOT / "docs" / "index.md").read_text()
