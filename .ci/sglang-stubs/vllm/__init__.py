"""Stub: sglang's rotary embedding imports `vllm._custom_ops` in its constructor on a CPU without
sgl-kernel's CPU ops; only the model's forward would call it, and the parity driver never runs the
forward."""
