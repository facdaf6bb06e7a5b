"""The command line: `rlsim` (Typer, with rich output).

Entry point: `rlsim.cli.app` (the app and `main`; `python -m rlsim.cli` runs it), with one module per
command group: `sim` (policies, simulate), `compare`, `trace`, `real` (run --real, validate), `plan`
(plan, sweep), `calibrate` and `profile`; `options` holds the options they share and `ui` the
console helpers. The top layer: imports every other layer, and nothing imports it.
"""
