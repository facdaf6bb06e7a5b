"""setuptools' entry for what pyproject.toml cannot say: the project's own packages, found rather
than listed (`rlsim*`, `policies*`, `calibrate*`; never `tests` or `benchmarks`), plus the data
package `rlsim._bundled`, which pyproject.toml maps onto the checkout's `traces/` folder (a mapped
package is not a folder that `packages.find` can find)."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["rlsim", "rlsim.*", "policies", "policies.*", "calibrate", "calibrate.*"]),
                "rlsim._bundled"])
