"""The ONNX node test cases, built once with onnx's in-memory loader and cached on disk.

``onnx.backend.test.loader.load_node_model_tests()`` generates every case (~10-30 s); the cache keeps the serialized
model and the input/output data so later runs start at once. Values are tagged: ``("array", ndarray)``,
``("tensor", bytes)`` for a TensorProto numpy cannot hold (float8, int4...), ``("sequence", [...])``,
``("none", None)``.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CACHE_FORMAT = 1


@dataclass
class NodeCase:
    name: str
    model: bytes
    inputs: list[tuple[str, Any]]
    outputs: list[tuple[str, Any]]
    rtol: float
    atol: float


def cache_dir() -> Path:
    import onnx

    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "hetero" / f"onnx-node-tests-{onnx.__version__}"


def _tag(value: Any) -> tuple[str, Any]:
    import onnx
    from onnx import numpy_helper

    if value is None:
        return ("none", None)
    if isinstance(value, list):
        return ("sequence", [_tag(v) for v in value])
    if isinstance(value, onnx.TensorProto):
        array = numpy_helper.to_array(value)
        if array.dtype.kind in "biufcO?" and array.dtype.names is None and array.dtype.type.__module__ == "numpy":
            return ("array", array)
        return ("tensor", value.SerializeToString())
    return ("array", np.asarray(value))


def _build() -> list[NodeCase]:
    from onnx.backend.test.loader import load_node_model_tests

    cases = []
    for case in load_node_model_tests():
        if case.name.endswith("_cuda"):
            continue
        (inputs, outputs), = case.data_sets
        cases.append(
            NodeCase(
                case.name,
                case.model.SerializeToString(),
                [_tag(v) for v in inputs],
                [_tag(v) for v in outputs],
                float(case.rtol),
                float(case.atol),
            )
        )
    return cases


def load_cases() -> list[NodeCase]:
    """All node cases, from the cache when it exists (it is rebuilt when missing or unreadable)."""
    path = cache_dir() / f"cases-v{CACHE_FORMAT}.pkl"
    if path.is_file():
        try:
            with path.open("rb") as f:
                return pickle.load(f)
        except Exception:  # a stale or truncated cache is rebuilt below
            pass
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = _build()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("wb") as f:
        pickle.dump(cases, f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)
    return cases
