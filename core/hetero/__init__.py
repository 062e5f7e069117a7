"""hetero: run ONNX graphs and LLMs on CPUs, GPUs and NPUs through backend plugins, falling back to the CPU.

    import hetero
    hetero.backends()                          # the status table of every installed backend
    session = hetero.Session("model.onnx", backends=["opencl", "cpu"])
    outputs = session.run({"input": array})

Importing hetero loads no plugin: discovery runs on the first query.
"""

from __future__ import annotations

from . import llm
from . import ops as _ops  # noqa: F401  (importing it registers the built-in op schemas)
from .contract import dtypes
from .contract.backend import API_VERSION
from .contract.errors import (
    BackendError,
    BackendUnavailable,
    FallbackError,
    HeteroError,
    HeteroWarning,
    InputError,
    ModelFormatError,
    PluginError,
    ShapeError,
    UnsupportedOp,
)
from .contract.tensor import Tensor, TensorInfo
from .frontends import load
from .runtime.session import Session

__version__ = "0.1.0"


def backends():
    """The status table: one row per backend (name, version, status, devices, reason, hint)."""
    from .plugins import statuses

    return statuses()


__all__ = [
    "API_VERSION",
    "BackendError",
    "BackendUnavailable",
    "FallbackError",
    "HeteroError",
    "HeteroWarning",
    "InputError",
    "ModelFormatError",
    "PluginError",
    "Session",
    "ShapeError",
    "Tensor",
    "TensorInfo",
    "UnsupportedOp",
    "backends",
    "dtypes",
    "llm",
    "load",
]
