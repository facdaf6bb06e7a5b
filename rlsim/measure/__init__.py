"""The measurement drivers behind `rlsim calibrate decode|spec|train|ops`: they run real engines
(`rlsim.real.vllm_engine`), the run's trainer (`rlsim.real.trainer`) or torch operators, and write
the records that `rlsim calibrate fit` (`rlsim.calibration.fit`) turns into a profile. They sit
above `rlsim.real`; the grid and the fit sit below it, in `rlsim.calibration`.
"""
