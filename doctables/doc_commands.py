"""Every shell command of the README and of docs/, as written, and whether it runs.

    python -m doctables.doc_commands                 # list them: file, line, what they need
    python -m doctables.doc_commands --run [--skip-slow] [--only TEXT] [--timeout S]

A command is a line (with its `\\` continuations) of a ```bash block. `--run` clones this
checkout's committed state into a scratch directory per page, as a reader following that page
starts from a fresh clone, and runs the page's commands there in the order they are written (a
command may use what an earlier one of its page wrote: the tiny model, a trace, a run directory;
the custom-policy example is saved as the `my_policies.py` its first line names). It prints a
table of exit codes and seconds. Commands that need what this machine lacks (a GPU, model
weights, a user's own files) are listed with the reason and not run; `--skip-slow` also leaves
out those written to take ten minutes or more. `tests/test_docs.py` parses every `rlsim` command
here with `--help` appended (an unknown option or command fails there), in CI.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rlsim.package_data.markers import REPO, documents

# what a command needs that this machine does not have, by a text it contains
NEEDS = (
    ("--device cuda", "a GPU"),
    ("Qwen/Qwen2.5-7B-Instruct", "model weights and a GPU"),
    ("runs/real-rollpacker", "the GPU run above it"),
    ("path/to/", "the user's own files"),
    ("mypkg.", "the user's own policy package"),
    ("pip install", "a package index (the install lines are what .ci/run itself runs)"),
)
# written to take ten minutes or more on a 2-core machine
SLOW = ("doctables.published_runs --fit", "rlsim.package_data terms", "scheduler_parity.py")


@dataclass(frozen=True)
class Command:
    """One command of a page: where it is written and its text (continuations joined)."""

    file: str
    line: int
    text: str

    @property
    def needs(self) -> str | None:
        for marker, what in NEEDS:
            if marker in self.text:
                return what
        return None

    @property
    def slow(self) -> bool:
        return any(s in self.text for s in SLOW)

    def rlsim_argv(self) -> list[str] | None:
        """The arguments after `rlsim`, or None if the command runs no rlsim."""
        words = shlex.split(self.text, comments=True)
        for i, w in enumerate(words):
            if w == "rlsim":
                rest = []
                for a in words[i + 1 :]:
                    if a in ("&&", ";", "|"):
                        break
                    rest.append(a)
                return rest
        return None


def commands(paths: list[Path] | None = None) -> list[Command]:
    """Every command of every ```bash block of the pages, in the order written."""
    found = []
    for path in paths or documents():
        lines = path.read_text().split("\n")
        in_bash = False
        i = 0
        while i < len(lines):
            ln = lines[i]
            if ln.startswith("```"):
                in_bash = not in_bash and ln.strip() == "```bash"
                i += 1
                continue
            if in_bash and ln.strip() and not ln.lstrip().startswith("#"):
                start, text = i, ln
                while text.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text.rstrip()[:-1] + " " + lines[i].strip()
                found.append(Command(str(path.relative_to(REPO)), start + 1, re.sub(r"\s+", " ", text.strip())))
            i += 1
    return found


def example(page: Path, name: str) -> str:
    """The code between a page's `<!-- example: NAME -->` markers."""
    m = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```\n<!-- end example", page.read_text(), re.S)
    return m.group(1) if m else ""


def run(cmds: list[Command], timeout: float, skip_slow: bool) -> int:
    """Run the commands, each page's in its own scratch clone; print one row each; return how many
    failed."""
    failed = 0
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    print("| page | line | command | result | seconds |\n|---|---:|---|---|---:|")
    with tempfile.TemporaryDirectory(prefix="rlsim-docs-") as tmp:
        clones: dict[str, Path] = {}
        for c in cmds:
            short = c.text if len(c.text) <= 90 else c.text[:87] + "..."
            if c.needs:
                print(f"| {c.file} | {c.line} | `{short}` | not run: needs {c.needs} | |", flush=True)
                continue
            if skip_slow and c.slow:
                print(f"| {c.file} | {c.line} | `{short}` | not run: slow (--skip-slow) | |", flush=True)
                continue
            if c.file not in clones:
                work = clones[c.file] = Path(tmp) / c.file.replace("/", "_")
                subprocess.run(["git", "clone", "-q", str(REPO), str(work)], check=True)
                code = example(REPO / c.file, "custom_policy")
                if code:
                    (work / "my_policies.py").write_text(code)
            t0 = time.monotonic()
            try:
                r = subprocess.run(["bash", "-c", c.text], cwd=clones[c.file], env=env, capture_output=True,
                                   text=True, timeout=timeout)  # fmt: skip
                rc, tail = r.returncode, (r.stderr.strip().splitlines() or [""])[-1]
            except subprocess.TimeoutExpired:
                rc, tail = 124, f"timed out after {timeout:.0f} s"
            dt = time.monotonic() - t0
            failed += rc != 0
            result = "ok" if rc == 0 else f"exit {rc}: {tail[:120]}"
            print(f"| {c.file} | {c.line} | `{short}` | {result} | {dt:.0f} |", flush=True)
    return failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="store_true", help="Run them in a scratch clone.")
    ap.add_argument("--skip-slow", action="store_true", help="Leave out those written to take 10 minutes or more.")
    ap.add_argument("--only", default="", help="Only commands whose page or text contains this.")
    ap.add_argument("--timeout", type=float, default=1800)
    a = ap.parse_args()
    cmds = [c for c in commands() if a.only in c.file or a.only in c.text]
    if not a.run:
        for c in cmds:
            print(f"{c.file}:{c.line}: {c.text}" + (f"   [needs {c.needs}]" if c.needs else ""))
        return
    sys.exit(min(run(cmds, a.timeout, a.skip_slow), 100))


if __name__ == "__main__":
    main()
