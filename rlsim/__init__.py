"""rlsim: simulate, calibrate and run rollout scheduling policies for LLM RL post-training.

The library imports no GPU package at module level; `rlsim --help` stays instant.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlsim")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
