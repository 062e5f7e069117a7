"""Shape inference over a graph, with constant folding: nodes whose inputs are all known are evaluated once.

The same ``infer_node`` serves the static pass at load time (unknown dims allowed) and the session at run time
(concrete shapes), so a model's shapes are computed by one piece of code either way.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

import numpy as np

from ..contract import registry
from ..contract.errors import HeteroError, ShapeError
from ..contract.graph import Graph, Node
from ..contract.registry import OpContext, OpSchema
from ..contract.tensor import TensorInfo, static_shape
from .evaluate import evaluate_node, info_of, run_graph

# Constant folding evaluates with the numpy reference; keep results that would bloat the model out of it.
FOLD_LIMIT_BYTES = 64 << 20
# Ops whose outputs depend on their inputs' shapes alone: they fold as soon as those shapes are static.
SHAPE_ONLY_OPS = {("", "Shape"), ("", "Size")}
# The largest tensor a node may produce, checked on its inferred shape before anything is allocated: a model (or a
# mutated shape input) asking for more is refused with the node named. Raise it with HETERO_MAX_TENSOR_BYTES.
MAX_TENSOR_BYTES_ENV = "HETERO_MAX_TENSOR_BYTES"
DEFAULT_MAX_TENSOR_BYTES = 1 << 30


def max_tensor_bytes() -> int:
    raw = os.environ.get(MAX_TENSOR_BYTES_ENV)
    if not raw:
        return DEFAULT_MAX_TENSOR_BYTES
    try:
        return int(float(raw))
    except ValueError:
        raise HeteroError(f"{MAX_TENSOR_BYTES_ENV}={raw!r} is not a number of bytes") from None


def infer_node(
    schema: OpSchema,
    node: Node,
    inputs: Sequence[TensorInfo | None],
    values: Sequence[np.ndarray | None],
    opset: int,
    run_subgraph: Callable[..., list[np.ndarray]] | None = None,
) -> list[TensorInfo]:
    """Output infos of one node; any failure becomes a ShapeError naming the node."""
    ctx = OpContext(node, inputs, values, opset, run_subgraph)
    try:
        outs = schema.infer(ctx)
    except HeteroError:
        raise
    except Exception as exc:
        raise ShapeError(f"{node.label()}: shape inference failed: {type(exc).__name__}: {exc}") from exc
    n_out = len(node.outputs)
    if len(outs) < n_out:
        raise ShapeError(f"{node.label()} declares {n_out} outputs but {schema.name} produces {len(outs)}")
    for name, info in zip(node.outputs, outs, strict=False):
        _check_size(node, name, info)
    if _all_known(schema, inputs, values):  # (at run time): every output shape must follow
        for name, info in zip(node.outputs, outs, strict=False):
            if name and not info.is_static:
                raise ShapeError(f"{node.label()}: the shape of output {name!r} does not follow from its inputs "
                                 f"({info}); is an input or attribute missing?")
    return list(outs[:n_out])


def _all_known(schema: OpSchema, inputs: Sequence[TensorInfo | None], values: Sequence[np.ndarray | None]) -> bool:
    """Every input's shape is concrete and every input read by value is given: nothing left to run time."""
    if schema.data_dependent or any(i is not None and not i.is_static for i in inputs):
        return False
    return all(i >= len(inputs) or inputs[i] is None or values[i] is not None for i in schema.value_inputs)


def _check_size(node: Node, name: str, info: TensorInfo) -> None:
    """No negative dims, and no tensor above the size limit (Python ints: dims such as 2**62 must not wrap)."""
    if info.shape is None:
        return
    if any(d is not None and d < 0 for d in info.shape):
        raise ShapeError(f"{node.label()}: output {name!r} would have the negative shape {list(info.shape)} "
                         "(the inputs are too small for the op's attributes)")
    if any(d is None for d in info.shape) or (info.dtype.itemsize == 0 and not info.dtype.is_block_quantized):
        return
    numel = math.prod(static_shape(info))
    nbytes = numel * info.dtype.itemsize if not info.dtype.is_block_quantized else \
        numel // info.dtype.block_size * info.dtype.block_bytes
    limit = max_tensor_bytes()
    if nbytes > limit:
        raise ShapeError(f"{node.label()}: output {name!r} of shape {list(info.shape)} ({info.dtype}) would take "
                         f"{nbytes:,} bytes, above the {limit:,}-byte limit on one tensor",
                         hint=f"set {MAX_TENSOR_BYTES_ENV} to a larger number of bytes if the model really needs it")


def fold_and_infer(graph: Graph, fold: bool = True, keep: frozenset[str] | set[str] = frozenset()) -> None:
    """Fill ``graph.values`` for every value; with ``fold``, replace constant subgraphs by initializers, except the
    nodes that compute a name in ``keep`` (a pass after the fold reads their constant inputs)."""
    # A rewrite may leave a producer after its reader; inferring (and pruning, which walks backwards) in list order
    # would then drop the producer without a word.
    graph.toposort()
    known: dict[str, np.ndarray] = dict(graph.initializers)
    for name, array in graph.initializers.items():
        graph.values[name] = info_of(array)
    kept: list[Node] = []
    partial_shapes: dict[str, list[int | None]] = {}  # a Shape's output not folded -> the dims it holds
    for node in graph.nodes:
        schema = registry.get(node.domain, node.op_type)
        opset = graph.opset(node.domain)
        infos = [graph.values.get(n) if n else None for n in node.inputs]
        for name, info in zip(node.inputs, infos, strict=True):
            if name and info is None:
                raise ShapeError(f"{node.label()}: input {name!r} has no known type")
        values = [known.get(n) if n else None for n in node.inputs]
        if fold and node.op_key == ("", "Gather") and node.inputs[0] in partial_shapes:
            picked = _static_dims_gathered(node, partial_shapes[node.inputs[0]], values[1])
            if picked is not None:
                known[node.outputs[0]] = graph.initializers[node.outputs[0]] = picked
                graph.values[node.outputs[0]] = info_of(picked)
                continue
        if node.op_key in SHAPE_ONLY_OPS:
            values = [_placeholder(i) if v is None and i is not None and i.is_static else v
                      for v, i in zip(values, infos, strict=True)]
        out_infos = infer_node(schema, node, infos, values, opset)
        if fold and not (keep and any(o in keep for o in node.outputs)) and _foldable(schema, node, values, out_infos):
            outs = evaluate_node(schema, node, values, opset, run_subgraph=run_graph)
            for name, array in zip(node.outputs, outs, strict=False):
                if name:
                    known[name] = array
                    graph.initializers[name] = array
                    graph.values[name] = info_of(array)
            continue
        for name, info in zip(node.outputs, out_infos, strict=True):
            if name:
                graph.values[name] = info
        if fold and node.op_key == ("", "Shape") and infos[0] is not None and infos[0].shape is not None:
            partial_shapes[node.outputs[0]] = _shape_dims(node, infos[0].shape)
        kept.append(node)
    graph.nodes = kept
    prune(graph)


def _shape_dims(shape_node: Node, dims: Sequence[int | str | None]) -> list[int | None]:
    """The dims a Shape node outputs (its ``start`` / ``end`` applied), None where a dim is not a known number."""
    rank = len(dims)
    start, end = int(shape_node.attrs.get("start", 0)), int(shape_node.attrs.get("end", rank))
    start, end = (min(max(i + rank if i < 0 else i, 0), rank) for i in (start, end))
    return [d if isinstance(d, int) else None for d in dims[start:end]]


def _static_dims_gathered(gather: Node, dims: list[int | None], indices: np.ndarray | None) -> np.ndarray | None:
    """``Gather(Shape(x), indices)`` as a constant where every dim it picks is known, though others (a dynamic
    batch) are not: TF exports compute SAME pads from the spatial dims this way (open_nsfw's MaxPool Pad), and the
    chain after it then folds. Run-time inputs must match the dims shape inference knows (check_input), so the
    picked dims are the dims of every run. None where an index is out of range or picks an unknown dim."""
    if indices is None or int(gather.attrs.get("axis", 0)) not in (0, -1) or indices.dtype.kind not in "iu":
        return None
    flat = [int(i) + len(dims) if int(i) < 0 else int(i) for i in np.asarray(indices).reshape(-1)]
    if any(not 0 <= i < len(dims) or dims[i] is None for i in flat):
        return None
    return np.asarray([dims[i] for i in flat], dtype=np.int64).reshape(np.asarray(indices).shape)


def _placeholder(info: TensorInfo) -> np.ndarray | None:
    """A zero-memory array of the right shape, standing in for a value only its shape matters for."""
    if info.dtype.np_dtype is None:
        return None
    return np.broadcast_to(np.zeros((), info.dtype.np_dtype), static_shape(info))


def _foldable(schema: OpSchema, node: Node, values: list[np.ndarray | None], outs: list[TensorInfo]) -> bool:
    """All inputs known, deterministic, no subgraph, and a result small enough to keep (checked before computing)."""
    if schema.nondeterministic or _has_subgraph(node):
        return False
    if any(v is None and n for v, n in zip(values, node.inputs, strict=True)):
        return False
    total = 0
    for info in outs:
        if not info.is_static or info.dtype.np_dtype is None:
            return bool(schema.data_dependent)  # data-dependent shapes are only known by running
        total += info.dtype.nbytes(int(np.prod(static_shape(info), dtype=np.int64)))
    return total <= FOLD_LIMIT_BYTES


def prune(graph: Graph) -> None:
    """Drop nodes and initializers that no graph output depends on."""
    needed = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if any(o in needed for o in node.outputs) or _has_side_effects(node):
            kept.append(node)
            needed.update(n for n in node.inputs if n)
            for sub in _subgraphs(node):
                from ..contract.graph import free_names

                needed.update(free_names(sub))
    graph.nodes = kept[::-1]
    graph.initializers = {k: v for k, v in graph.initializers.items() if k in needed}


def _subgraphs(node: Node) -> list[Graph]:
    return [v for v in node.attrs.values() if isinstance(v, Graph)]


def _has_subgraph(node: Node) -> bool:
    return bool(_subgraphs(node))


def _has_side_effects(node: Node) -> bool:
    return False
