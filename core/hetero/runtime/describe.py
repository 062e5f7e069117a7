"""What a session tells and checks at its edges, in onnxruntime's habits: input / output descriptions, the two
``run`` call forms, option keys and opsets (see the mapping table in docs/architecture.md)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import HeteroError, HeteroWarning, InputError
from ..ir.graph import Graph

# The newest ai.onnx opset whose node tests the conformance suite (tests/onnx_conformance, onnx 1.23) passes.
NEWEST_ONNX_OPSET = 28
# Session options the core reads; backends add theirs through ``Backend.option_keys``.
CORE_OPTIONS = ("threads",)


@dataclass(frozen=True)
class ValueInfo:
    """One graph input or output, as onnxruntime's ``NodeArg``: ``type`` like ``tensor(float)``; ``shape`` holds a
    number per fixed dim, the model's name for a symbolic one ("batch"), None where the model names none."""

    name: str
    type: str
    shape: list[int | str | None] | None


def value_infos(graph: Graph, names: Sequence[str]) -> list[ValueInfo]:
    found = []
    for name in names:
        info = graph.values.get(name)
        symbolic = graph.dim_names.get(name)
        shape: list[int | str | None] | None = None
        if info is not None and info.shape is not None:
            shape = [d if d is not None or symbolic is None or i >= len(symbolic) else symbolic[i]
                     for i, d in enumerate(info.shape)]
        found.append(ValueInfo(name, f"tensor({_onnx_type(info.dtype.name)})" if info else "tensor(?)", shape))
    return found


def _onnx_type(name: str) -> str:
    return {"float32": "float", "float64": "double", "float16": "float16"}.get(name, name)


def run_arguments(first: Any, second: Any, outputs: Sequence[str] | None) -> tuple[dict[str, Any], Any, bool]:
    """(feeds, wanted output names or None, whether to answer with a list) from ``run(feeds[, outputs])`` or
    onnxruntime's ``run(output_names | None, feeds)``."""
    if isinstance(first, dict) and (second is None or _names(second)) and (second is None or outputs is None):
        return first, (list(second) if second is not None else outputs), False
    if isinstance(second, dict) and (first is None or _names(first)) and outputs is None:
        return second, (None if first is None else list(first)), True
    raise InputError("run() takes run(feeds), run(feeds, outputs=[names]) or onnxruntime's run(output_names, "
                     f"feeds) with feeds a dict of name -> array; got ({type(first).__name__}, "
                     f"{type(second).__name__})")


def _names(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)


def check_options(options: dict[str, Any], backend_keys: Iterable[str]) -> None:
    known = sorted({*CORE_OPTIONS, *backend_keys})
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise HeteroError(f"unknown session option(s) {unknown}; known: {known}")


def check_opsets(graph: Graph) -> None:
    version = graph.opsets.get("", 0)
    if version > NEWEST_ONNX_OPSET:
        warnings.warn(f"hetero: the model asks for ai.onnx opset {version}; hetero's ops follow opsets up to "
                      f"{NEWEST_ONNX_OPSET}, so newer semantics may differ", HeteroWarning, stacklevel=4)
