"""Stub of the one kernel sglang's rotary embedding imports (never called: see the package)."""


def rotary_embedding(*args: object, **kwargs: object) -> None:
    raise RuntimeError("stub: the SGLang parity driver never runs the model's forward")
