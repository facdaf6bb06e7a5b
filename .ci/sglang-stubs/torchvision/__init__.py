"""Stub of torchvision for SGLang's parity environment.

sglang's model configs import transformers' `AutoProcessor`, whose image processors import names
from `torchvision.io`, `torchvision.transforms` and the like at module level. A text request never
reaches an image processor, so nothing of torchvision runs: every submodule and name here is a
placeholder that only satisfies those imports. (The torchvision wheel the index offers is a CUDA
build, which breaks transformers' imports on a CPU.)
"""

import sys
import types

__version__ = "0.0.0"


class _Placeholder(types.ModuleType):
    """A module whose every name is another placeholder (callable, subclassable)."""

    def __getattr__(self, name: str) -> "_Placeholder":
        if name.startswith("__"):
            raise AttributeError(name)
        sub = _Placeholder(f"{self.__name__}.{name}")
        sub.__path__ = []
        sys.modules[sub.__name__] = sub
        setattr(self, name, sub)
        return sub

    def __call__(self, *args: object, **kwargs: object) -> object:
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else self

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


for _name in ("transforms", "transforms.functional", "transforms.v2", "transforms.v2.functional", "io", "ops",
              "models", "datasets", "utils"):  # fmt: skip
    _module = _Placeholder(f"torchvision.{_name}")
    _module.__path__ = []
    sys.modules[_module.__name__] = _module
transforms = sys.modules["torchvision.transforms"]
io = sys.modules["torchvision.io"]
ops = sys.modules["torchvision.ops"]
