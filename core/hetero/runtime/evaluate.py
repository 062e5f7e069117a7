"""Run a graph with the numpy reference alone: constant folding, subgraphs of If/Loop/Scan, and test oracles."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..contract import dtypes, registry
from ..contract.errors import HeteroError
from ..contract.graph import Graph, Node
from ..contract.registry import OpContext, OpSchema
from ..contract.tensor import TensorInfo


def info_of(array: np.ndarray) -> TensorInfo:
    return TensorInfo(dtypes.from_numpy(array.dtype), tuple(array.shape))


def evaluate_node(
    schema: OpSchema, node: Node, values: Sequence[np.ndarray | None], opset: int, run_subgraph=None
) -> list[np.ndarray]:
    infos = [None if v is None else info_of(v) for v in values]
    ctx = OpContext(node, infos, values, opset, run_subgraph)
    try:
        outs = schema.reference(ctx)
    except HeteroError:
        raise
    except Exception as exc:
        raise HeteroError(f"{node.label()}: reference implementation failed: {type(exc).__name__}: {exc}") from exc
    return [np.asarray(o) for o in outs[: len(node.outputs)]]


def run_graph(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Evaluate ``graph`` on ``feeds`` (which may also hold outer-scope names); returns the graph outputs in order."""
    env: dict[str, np.ndarray] = {**graph.initializers, **feeds}
    for node in graph.nodes:
        schema = registry.get(node.domain, node.op_type)
        values = [env[n] if n else None for n in node.inputs]
        outs = evaluate_node(schema, node, values, graph.opset(node.domain), run_subgraph=_scoped(env))
        for name, value in zip(node.outputs, outs, strict=False):
            if name:
                env[name] = value
    return [env[name] for name in graph.outputs]


def _scoped(env: dict[str, np.ndarray]):
    """A subgraph runner that sees the enclosing graph's values (ONNX outer scope)."""

    def run_subgraph(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return run_graph(graph, {**env, **feeds})

    return run_subgraph
