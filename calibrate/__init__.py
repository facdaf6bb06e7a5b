"""What runs real engines on a CPU beside the library: `calibrate.tiny_model` (a tiny random Llama
for tests and CPU runs) and `calibrate.side_by_side` (independent real runs side by side, one per
core, for the tests and the benchmarks that time nothing). Measuring a real engine is `rlsim
calibrate decode|spec|train|ops|fit` (`rlsim.measure`, `rlsim.calibration`); the shipped profiles
are package data of rlsim (`rlsim/profiles/`, written by `python -m rlsim.package_data profiles`).
"""
