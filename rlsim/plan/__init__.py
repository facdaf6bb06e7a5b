"""Planning: what-if questions answered by many simulations.

Entry points: `rlsim.plan.planner.plan` (`rlsim plan`: placement, rollout/train split, rollout TP,
engine knobs and response cap searched by successive halving, with seeds as error bars; its
estimates kept by `rlsim.plan.cache`), `rlsim.plan.space` (the candidates and their checks),
`rlsim.plan.report` (the answer tables and the Pareto plot) and `rlsim.plan.sweep` (`rlsim sweep`:
the points of a `rlsim.plan.grid` file on a process pool or Ray, resumable). Imports the core,
trace and the simulator; never real mode or the CLI.
"""
