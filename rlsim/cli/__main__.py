"""`python -m rlsim.cli ...`: the `rlsim` command, without the console script."""

from rlsim.cli.app import main

main()
