"""The simulator's compiled core: vLLM's scheduling state and SimPy's event loop as arrays, compiled
with numba.

Written once in the subset of Python numba compiles (`jit`), so the same source also runs as plain
Python (`RLSIM_PURE_PYTHON=1`, or numba missing) and gives the same bytes. `block_pool` is the KV
block pool and prefix cache (`rlsim.sim.kv_blocks.BlockPool`), `scheduler` the scheduler
(`rlsim.sim.scheduler.InstanceScheduler`), `engine` the instances' processes and the event queue
(`rlsim.sim.engine.SimEngine`), and `sim_engine.CompiledEngine` puts them behind the `Engine`
protocol. Each is held equal to its Python original by a test; `simulate` runs `CompiledEngine`
unless asked for `SimEngine` (`engine="simpy"`, `RLSIM_ENGINE=simpy`) or replaying measured times.
"""
