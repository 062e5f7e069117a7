"""Run a graph with the numpy reference alone: constant folding, subgraphs of If/Loop/Scan, and test oracles."""

from __future__ import annotations

import numpy as np

from ..contract import registry
from ..contract.graph import Graph


def run_graph(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Evaluate ``graph`` on ``feeds`` (which may also hold outer-scope names); returns the graph outputs in order."""
    from .infer import evaluate_node

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
