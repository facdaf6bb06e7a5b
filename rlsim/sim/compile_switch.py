"""Whether compiled code compiles here, and for which CPU: read without importing numba.

Two facts every compiled function of rlsim shares, the core's (`rlsim.sim.compiled.jit`) and the
kernels the Python schedulers call (`rlsim.sim.running_offsets`): `RLSIM_PURE_PYTHON=1` leaves
the source as plain Python, and the machine code is for the generic x86-64 CPU unless the user
chose one (`NUMBA_CPU_NAME`), so that the shipped code and a cache copied between machines load
anywhere. It lies beside the core rather than in it: the core's modules import the scheduler
seam and so the schedulers, which read it too (a cycle otherwise). It imports nothing of numba:
numba's llvmlite, once imported, breaks vLLM's kernel scan in a process that later starts a real
engine (see `rlsim.sim.simulate`), so a module imported by real mode reads the switch here and
imports numba only when it first compiles.
"""

from __future__ import annotations

import os


def pure_python() -> bool:
    """Whether the user asked for the pure-Python path (`RLSIM_PURE_PYTHON` set and not 0)."""
    return os.environ.get("RLSIM_PURE_PYTHON", "") not in ("", "0")


def use_generic_cpu() -> None:
    """Compile for the generic x86-64 CPU unless the user set `NUMBA_CPU_NAME`; numba reads it when
    it is imported, or at its next compile."""
    os.environ.setdefault("NUMBA_CPU_NAME", "generic")
