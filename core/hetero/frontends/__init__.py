"""Model front ends: turn a model file (or an in-memory model) into a hetero ``Graph``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import plugins
from ..contract.errors import ModelFormatError
from ..contract.graph import Graph


def load(model: Any) -> Graph:
    """Load a model: a ``Graph``, an ``onnx.ModelProto``, serialized ONNX bytes, or a path to a model file.

    Paths are dispatched on their suffix; plugins add suffixes through the ``hetero_register_loaders`` hook.
    """
    if isinstance(model, Graph):
        return model
    plugins.load_plugins()  # the model may use ops, and its path a suffix, that plugins add
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.exists():
            raise ModelFormatError(f"model file {str(path)!r} does not exist")
        suffix = path.suffix.lower()
        if suffix == ".onnx" or (suffix not in _plugin_loaders() and path.is_file()):
            from .onnx import load_onnx

            return load_onnx(path)
        return _plugin_loaders()[suffix](path)
    from .onnx import load_onnx

    return load_onnx(model)


def _plugin_loaders() -> dict[str, Any]:
    return {suffix.lower(): fn for suffix, fn in plugins.loaders().items()}


__all__ = ["load"]
