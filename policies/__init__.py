"""Rollout scheduling policies: plain Python objects that import neither simpy nor vllm.

Each policy is one module that a reader understands alone (see POLICIES in the docs); the same
object drives the simulator and real vLLM engines through the driver's Engine protocol.
"""
