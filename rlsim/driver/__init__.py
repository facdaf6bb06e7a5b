"""The driver: the one RL loop that simulated and real engines run under, with the same policy objects.

Entry points: `rlsim.driver.loop.run_loop` (run a policy on an engine until the epochs are trained),
`rlsim.driver.driver.Driver` (a run's state: data order, visits, requests, rewards, training; its
`snapshot`/`restore` resume a real run), `rlsim.driver.view.View` (what a policy may see),
`rlsim.driver.launch` (Launch to Request, and placement), `rlsim.driver.dispatch` (per-sample
least-loaded dispatch), `rlsim.driver.dynamic_sampling` (DAPO's group filter) and
`rlsim.driver.trace_index` (the trace look-up the policy never sees). Imports the base modules and
`rlsim.trace`; never the simulator, real mode, the planner or the CLI.
"""
