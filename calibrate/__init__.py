"""Calibration: measure decode iteration time, KV capacity, training cost and speculative
acceptance on real hardware under vLLM (`python -m calibrate.<script>`), and the shipped
profiles under `calibrate/profiles/` with their provenance.
"""
