"""Traces: the RL step trace format and everything that makes or reads one.

Entry points: `rlsim.trace.format` (`Trace`, `TraceMeta`, `load`, `save`, `validate_table`),
`rlsim.trace.synth` (a seeded synthetic trace from a preset), `rlsim.trace.presets` (response-length
models fitted to real logs), `rlsim.trace.fit` and `rlsim.trace.fit_check` (fit a preset to a log and
cross-validate it), `rlsim.trace.importers` (PolyTrace, veRL and slime logs to a trace),
`rlsim.trace.stats` (per-epoch statistics, trace comparison), `rlsim.trace.tokens` (token ids) and
`rlsim.trace.tasks` (the built-in task a tiny model learns on a CPU). Imports only the core
(`rlsim.errors`); used by the driver, the simulator, real mode and the planner.
"""
