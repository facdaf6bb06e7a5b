"""Calibration's pure layer: the decode grid and the fit of the iteration model to measured
iterations. It runs no engine: the measurement drivers (`rlsim calibrate decode`, `.spec`, `.train`,
`.ops`) sit above `rlsim.real`, which owns the vLLM engine factory (`rlsim.real.vllm_engine`).
"""
