"""The graph IR: nodes in topological order over named values, as in ONNX, plus static tensor info per value."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ModelFormatError
from .tensor import TensorInfo

ONNX_DOMAIN = ""  # ai.onnx; "ai.onnx" is normalised to ""
HETERO_DOMAIN = "hetero"
MICROSOFT_DOMAIN = "com.microsoft"  # onnxruntime's contrib ops that hetero implements
ML_DOMAIN = "ai.onnx.ml"  # ONNX's classical machine-learning ops (tree ensembles)


@dataclass(eq=False)  # two nodes with equal fields are two nodes: passes find and remove them by identity
class Node:
    """One op application. ``inputs`` may hold "" for an omitted optional input."""

    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = ONNX_DOMAIN

    @property
    def op_key(self) -> tuple[str, str]:
        return (self.domain, self.op_type)

    def label(self) -> str:
        return f"{self.op_type} node {self.name!r}" if self.name else f"{self.op_type} node -> {self.outputs}"


@dataclass
class Graph:
    """A model: nodes in topological order, graph inputs/outputs, initializers (constant weights) and value info."""

    nodes: list[Node] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)  # runtime inputs, initializers excluded
    outputs: list[str] = field(default_factory=list)
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, TensorInfo] = field(default_factory=dict)
    opsets: dict[str, int] = field(default_factory=lambda: {ONNX_DOMAIN: 21})
    name: str = "graph"
    # Names visible from an enclosing graph (subgraphs of If/Loop/Scan read them).
    outer_scope: frozenset[str] = frozenset()
    # Symbolic dim names of graph inputs / outputs as the model file gives them ("batch"; None where it gives none).
    dim_names: dict[str, tuple[str | None, ...]] = field(default_factory=dict)
    # ai.onnx.ml ZipMap nodes that end a classifier (skl2onnx's default export): graph output name -> (the [N, C]
    # probabilities it zips, the class labels). They stay out of ``nodes``: the Session builds their list of dicts.
    zipmaps: dict[str, tuple[str, list[Any]]] = field(default_factory=dict)

    def copy(self) -> Graph:
        """A graph that passes may rewrite without touching this one: fresh nodes, lists and dicts; the weight
        arrays and subgraph attributes are shared (passes never modify them)."""
        nodes = [Node(n.op_type, list(n.inputs), list(n.outputs), dict(n.attrs), n.name, n.domain) for n in self.nodes]
        return Graph(nodes, list(self.inputs), list(self.outputs), dict(self.initializers), dict(self.values),
                     dict(self.opsets), self.name, self.outer_scope, dict(self.dim_names),
                     dict(self.zipmaps))

    def opset(self, domain: str) -> int:
        return self.opsets.get(domain, self.opsets.get(ONNX_DOMAIN, 21) if domain == ONNX_DOMAIN else 1)

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        table: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    table.setdefault(name, []).append(node)
        return table

    def readers(self, name: str) -> list[Node]:
        """The nodes that read ``name``: one scan, for passes that ask about a value or two (``consumers()`` builds
        the whole table, which made a pass asking thousands of times quadratic in the graph's size)."""
        return [node for node in self.nodes if name in node.inputs] if name else []

    def walk(self) -> Iterator[tuple[int, Node]]:
        yield from enumerate(self.nodes)

    def toposort(self) -> None:
        """Order nodes so each comes after the producers of its inputs (keeping the given order where it already
        is one); raise on cycles or undefined values. Kahn's algorithm: linear in nodes + edges, whatever the order
        the file lists them in."""
        available = set(self.inputs) | set(self.initializers) | set(self.outer_scope) | {""}
        producer = {o: i for i, node in enumerate(self.nodes) for o in node.outputs if o}
        waiting_on = [0] * len(self.nodes)  # producers each node still waits for
        readers: dict[int, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for name in dict.fromkeys([*node.inputs, *_implicit_inputs(node)]):
                if name in available:
                    continue
                p = producer.get(name)
                if p is None:
                    raise ModelFormatError(
                        f"{node.label()} in graph {self.name!r} reads {name!r}, which is neither a graph input, "
                        "an initializer nor the output of any node",
                    )
                waiting_on[i] += 1
                readers.setdefault(p, []).append(i)
        ready = [i for i, n in enumerate(waiting_on) if n == 0]
        heapq.heapify(ready)
        ordered: list[Node] = []
        while ready:
            i = heapq.heappop(ready)
            ordered.append(self.nodes[i])
            for r in readers.get(i, ()):
                waiting_on[r] -= 1
                if waiting_on[r] == 0:
                    heapq.heappush(ready, r)
        if len(ordered) < len(self.nodes):
            stuck = next(n for i, n in enumerate(self.nodes) if waiting_on[i])
            raise ModelFormatError(f"graph {self.name!r} has a cycle through {stuck.label()}")
        self.nodes = ordered

    def validate_outputs(self) -> None:
        available = set(self.inputs) | set(self.initializers) | {o for n in self.nodes for o in n.outputs}
        for name in self.outputs:
            if name not in available and name not in self.zipmaps:
                raise ModelFormatError(f"graph {self.name!r} output {name!r} is produced by no node")


def _implicit_inputs(node: Node) -> list[str]:
    """Outer-scope names read by the subgraphs of a control-flow node."""
    names: list[str] = []
    for value in node.attrs.values():
        if isinstance(value, Graph):
            names.extend(free_names(value))
    return names


def free_names(graph: Graph) -> list[str]:
    """Names a (sub)graph reads but does not define itself."""
    defined = set(graph.inputs) | set(graph.initializers) | {o for n in graph.nodes for o in n.outputs}
    free: list[str] = []
    for node in graph.nodes:
        for name in [*node.inputs, *_implicit_inputs(node)]:
            if name and name not in defined and name not in free:
                free.append(name)
    free.extend(o for o in graph.outputs if o not in defined and o not in free)
    return free
