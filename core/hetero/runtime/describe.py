"""What a session tells and checks at its edges: input / output descriptions and the two ``run`` call forms in
onnxruntime's habits (see the mapping table in docs/architecture.md), feeds, option keys and opsets checked, and the
``explain()`` table."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..contract.backend import Backend, Segment
from ..contract.errors import HeteroError, HeteroWarning, InputError
from ..contract.graph import Graph
from ..contract.tensor import Tensor, TensorInfo
from .partition import Placement

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
                      f"{NEWEST_ONNX_OPSET}, so newer semantics may differ", HeteroWarning, stacklevel=3)


def bind_inputs(graph: Graph, feeds: dict[str, Any]) -> dict[str, Tensor]:
    """The feeds as tensors, checked against the graph's inputs (names, dtypes, ranks, fixed dims)."""
    if not isinstance(feeds, dict):
        raise InputError(f"inputs must be a dict of name -> array, got {type(feeds).__name__}")
    unknown = [n for n in feeds if n not in graph.inputs]
    if unknown:
        raise InputError(f"unknown input(s) {unknown}; the model's inputs are {graph.inputs}")
    env: dict[str, Tensor] = {}
    for name in graph.inputs:
        info = graph.values.get(name)
        if name not in feeds:
            raise InputError(f"missing input {name!r} ({info})")
        value = feeds[name]
        tensor = value if isinstance(value, Tensor) else Tensor.from_numpy(np.asarray(value))
        if info is not None:
            check_input(name, tensor, info)
        env[name] = tensor
    return env


def check_input(name: str, tensor: Tensor, info: TensorInfo) -> None:
    if tensor.dtype != info.dtype:
        raise InputError(f"input {name!r} has dtype {tensor.dtype}; the model expects {info.dtype}")
    if info.shape is None:
        return
    if len(tensor.shape) != len(info.shape):
        raise InputError(f"input {name!r} has shape {list(tensor.shape)}; the model expects rank {len(info.shape)} "
                         f"({info})")
    for axis, (got, want) in enumerate(zip(tensor.shape, info.shape, strict=True)):
        if want is not None and got != want:
            raise InputError(f"input {name!r} has shape {list(tensor.shape)}; dim {axis} must be {want} ({info})")


def explain(graph: Graph, backends: Sequence[Backend], placement: Placement, segments: Sequence[Segment]) -> str:
    """Node -> backend (and segment), each refusal, and the copies a run makes, as a readable table."""
    segment_of = {id(info.node): s.index for s in segments for info in s.nodes}
    rows = [("node", "op", "backend", "segment", "why not earlier backends")]
    for p in placement.nodes:
        why = "; ".join(f"{b}: {r}" for b, r in p.refusals.items())
        where = p.backend + (f" ({p.implementation})" if p.implementation else "")
        segment = str(segment_of.get(id(graph.nodes[p.index]), ""))
        rows.append((p.name, p.op_type, where + (" (fallback)" if p.fallback else ""), segment, why))
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    lines = [f"backends: {', '.join(b.name for b in backends)}"]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in range(4)) + "  " + r[4] for r in rows]
    counts = ", ".join(f"{b}: {n}" for b, n in placement.counts().items())
    lines.append(f"nodes per backend: {counts}; segments: {len(segments)}")
    lines.append("copies:" if placement.copies else "copies: none")
    lines += [f"  {c.value}: {c.src} -> {c.dst}" for c in placement.copies]
    return "\n".join(line.rstrip() for line in lines)
