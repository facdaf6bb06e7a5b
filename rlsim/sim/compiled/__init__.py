"""The simulator's compiled core: vLLM's and SGLang's scheduling state and SimPy's event loop as
arrays, compiled with numba.

Written once in the subset of Python numba compiles (`jit`), so the same source also runs as plain
Python (`RLSIM_PURE_PYTHON=1`, or numba missing) and gives the same bytes. `block_pool` is the KV
block pool and prefix cache (`rlsim.sim.kv_blocks.BlockPool`), `scheduler` the scheduler
(`rlsim.sim.scheduler.InstanceScheduler`), `engine` the instances' processes and the event queue
(`rlsim.sim.engine.SimEngine`), and `sim_engine.CompiledEngine` puts them behind the `Engine`
protocol. SGLang's rules are arrays too: `radix` its radix cache (`rlsim.sim.radix_cache`),
`sglang` its scheduler (`rlsim.sim.sglang_scheduler.SGLangScheduler`). The engine asks its
instances' rules through `rules`, one function per question whatever the rules (the compiled form
of `rlsim.sim.rollout_scheduler.RolloutScheduler`), so it is compiled once for each rules' state.
Each part is held equal to its Python original by a test; `simulate` runs `CompiledEngine`
unless asked for `SimEngine` (`engine="simpy"`, `RLSIM_ENGINE=simpy`), replaying measured times,
or running what the core does not (`rlsim.sim.simulate.compiled_covers`).
"""
