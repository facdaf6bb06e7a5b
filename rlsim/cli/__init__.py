"""The command line: `rlsim` (Typer, with rich output).

Entry point: `rlsim.cli.app` (the app and `main`; `python -m rlsim.cli` runs it), with one module per
command group: `sim` (simulate, compare, sweep), `trace`, `real` (run --real, validate), `plan`,
`calibrate` and `profile`; `ui` holds the shared progress bar and error printing. The top layer:
imports every other layer, and nothing imports it.
"""
