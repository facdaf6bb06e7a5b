"""The script that stays a script: `calibrate.tiny_model` (a tiny random Llama for tests and CPU
runs). Measuring a real engine is `rlsim calibrate decode|spec|train|ops|fit` (`rlsim.measure`,
`rlsim.calibration`); the shipped profiles are package data of rlsim (`rlsim/profiles/`, written by
`python -m rlsim.package_data profiles`).
"""
