"""The simulator's compiled core: vLLM's scheduling state as arrays, compiled with numba.

Written once in the subset of Python numba compiles (`jit`), so the same source also runs as plain
Python (`RLSIM_PURE_PYTHON=1`, or numba missing) and gives the same bytes. So far: the KV block
pool and prefix cache (`block_pool`), held equal to `rlsim.sim.kv_blocks.BlockPool`, and the
scheduler (`scheduler`), speculative decoding included, held equal to `InstanceScheduler`
iteration by iteration. The engine does not run on them yet: its loop over instances
(`rlsim.sim.engine`) is the part left to port.
"""
