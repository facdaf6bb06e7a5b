"""The shipped profiles (`calibrate/profiles/`, with their provenance) and the two scripts that
stay scripts: `calibrate.derive_profiles` (the shipped profiles from model facts and datasheets)
and `calibrate.tiny_model` (a tiny random Llama for tests and CPU runs). Measuring a real engine
is `rlsim calibrate decode|spec|train|ops|fit` (`rlsim.measure`, `rlsim.calibration`).
"""
