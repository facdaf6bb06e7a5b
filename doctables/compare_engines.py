"""`rlsim compare --rollout-engine vllm,sglang` on the bundled default: every policy under vLLM's
scheduling rules and under SGLang's, side by side (docs/simulate.md, "SGLang's rules").

    python -m doctables.compare_engines [--markdown | --readme]

The defaults of `rlsim compare` (64 H100s of Qwen2.5-32B at TP 4, veRL's engine limits, the trace's
two epochs), the costs the same under both: only the scheduling rules differ. The policies that
speculate run under vLLM's rules only. Deterministic, but about six minutes on a 2-core machine
(nineteen runs of the whole trace), so CI does not re-run it (`tests/test_readme_tables.py`, SLOW).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rlsim.package_data.markers import emit


def main() -> int:
    cmd = [sys.executable, "-m", "rlsim.cli", "compare", "--rollout-engine", "vllm,sglang", "--markdown"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if out.returncode:
        print(out.stderr, file=sys.stderr)
        return out.returncode
    emit("compare_engines", out.stdout.strip(), sys.argv[1:])
    if not {"--markdown", "--readme"} & set(sys.argv[1:]):
        print(out.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
