"""The simulator: a SimPy rollout cluster that schedules as vLLM's v1 scheduler does, driven by the
same driver and policy objects as real mode.

Entry points: `rlsim.sim.simulate.simulate` (one policy on one trace and cluster, a `Result`),
`rlsim.sim.compare` (every policy side by side), `rlsim.sim.engine.SimEngine` (the `Engine` of
`rlsim.protocol`; its event jumping in `rlsim.sim.jump`, its replay of measured iteration times in
`rlsim.sim.replay`), `rlsim.sim.rollout_scheduler` (the seam: what the engine asks of an instance's
scheduler, and `make_scheduler`), `rlsim.sim.vllm_rules` (vLLM 0.32's `Scheduler` and
`AsyncScheduler` from the compiled core's source, what both engines run; `rlsim.sim.sched_parity`
checks it against vLLM's own `Scheduler`), `rlsim.sim.scheduler.InstanceScheduler` and
`AsyncInstanceScheduler` (their readable twin, with `seq`, `running`, `jump_plan` and the block
pool of `kv_blocks`, that tests hold the compiled rules to), `rlsim.sim.sglang_scheduler` (SGLang 0.5.23's
rules, over `radix_cache` and `running_offsets`: the readable twin of the compiled rules both
engines run, `SimEngine` through `sglang_rules`; `sglang_parity` checks them against SGLang's own
`Scheduler`) and `rlsim.sim.compiled` (the engine and both engines' rules compiled, what
`simulate` runs). Imports the core, `rlsim.trace` and `rlsim.spec`; never real mode, the planner or the CLI.
"""
