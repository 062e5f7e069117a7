"""Segments: the placed graph cut into maximal runs of consecutive nodes on one backend, and the copies between them.

Each segment is compiled into one program (``Backend.compile``, else the core's ``executor.KernelProgram``). Values
cross memory domains only at segment inputs and at the graph's outputs; those copies are decided here, once: a value
is copied into a domain by the first segment there that reads it and shared by later ones. ``Session.run`` performs
exactly these copies and ``Session.explain()`` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..contract.backend import Backend, NodeInfo, Segment
from ..contract.graph import Graph, Node, free_names
from .partition import CopyEdge, Placement


@dataclass
class Edge:
    """How one segment gets its inputs: by name, each either as it is or copied into the segment's domain."""

    segment: Segment
    backend: Backend
    sources: list[tuple[str, bool]] = field(default_factory=list)  # (value, copied into backend.memory_domain)
    drop: list[str] = field(default_factory=list)  # values no later segment reads: released after this one


def outer_names(node: Node) -> list[str]:
    """Values of the enclosing graph that a node's subgraph attributes (If / Loop / Scan bodies) read."""
    return [n for sub in node.attrs.values() if isinstance(sub, Graph) for n in free_names(sub)]


def cut(graph: Graph, infos: list[NodeInfo], placement: Placement, backends: dict[str, Backend]) -> list[Edge]:
    """The segments in run order, with their planned input copies; fills ``placement.copies``."""
    reads = [[n for n in [*node.inputs, *outer_names(node)] if n] for node in graph.nodes]
    last_read: dict[str, int] = {}
    for i, names in enumerate(reads):
        for name in names:
            last_read[name] = i
    runs: list[list[int]] = []
    for p in placement.nodes:
        if runs and placement.nodes[runs[-1][-1]].backend == p.backend:
            runs[-1].append(p.index)
        else:
            runs.append([p.index])
    outputs = set(graph.outputs)
    producer: dict[str, str] = {}  # value -> backend name
    copied: set[tuple[str, str]] = set()  # (value, domain) already copied by an earlier segment
    edges: list[Edge] = []
    copies: list[CopyEdge] = []
    for members in runs:
        backend = backends[placement.nodes[members[0]].backend]
        nodes = [graph.nodes[i] for i in members]
        produced = {o for node in nodes for o in node.outputs if o}
        read = [n for i in members for n in reads[i] if n not in produced]
        inputs = [n for n in dict.fromkeys(read) if n not in graph.initializers]
        end = members[-1]
        seg_outputs = [o for node in nodes for o in node.outputs
                       if o and (o in outputs or last_read.get(o, -1) > end)]
        sub = Graph(
            nodes=nodes,
            inputs=inputs,
            outputs=list(dict.fromkeys(seg_outputs)),
            initializers={n: graph.initializers[n] for n in read if n in graph.initializers},
            values={n: graph.values[n] for n in [*inputs, *produced] if n in graph.values},
            opsets=dict(graph.opsets),
            name=f"{backend.name}_segment{len(edges)}",
        )
        segment = Segment(len(edges), sub, [infos[i] for i in members], frozenset(o for o in seg_outputs
                                                                                   if o in outputs))
        edge = Edge(segment, backend)
        domain = backend.memory_domain
        for name in inputs:
            src = producer.get(name, "host")
            move = _domain(src, backends) != domain
            if move and (name, domain) not in copied:
                copied.add((name, domain))
                copies.append(CopyEdge(name, src, backend.name))
            edge.sources.append((name, move))
        for name in produced:
            producer[name] = backend.name
        edges.append(edge)
    for name in graph.outputs:
        last = producer.get(name)
        if last is not None and _domain(last, backends) != "host":
            copies.append(CopyEdge(name, last, "host"))
    _plan_drops(edges, outputs)
    placement.copies = copies
    return edges


def _domain(backend: str, backends: dict[str, Backend]) -> str:
    found = backends.get(backend)
    return "host" if found is None else found.memory_domain


def _plan_drops(edges: list[Edge], outputs: set[str]) -> None:
    last: dict[str, int] = {}
    for i, edge in enumerate(edges):
        for name, _ in edge.sources:
            last[name] = i
        for name in edge.segment.graph.outputs:
            last.setdefault(name, i)
    for name, i in last.items():
        if name not in outputs:
            edges[i].drop.append(name)
