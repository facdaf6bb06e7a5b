"""Errors that mean "the user's input is wrong", as opposed to bugs.

The CLI turns any `RlsimError` into one line on stderr and exit code 2; everything else is a
bug and keeps its traceback.
"""


class RlsimError(Exception):
    """Bad input from the user: a file, a flag or a configuration that cannot be used."""


class TraceError(RlsimError):
    """A trace file is malformed or inconsistent; the message names the problem."""
