"""Partitioning: each node goes to the first backend (in preference order) that supports it.

Whole-graph backends (NPUs) may first claim groups of nodes through ``Backend.partition``; the rest are placed node
by node. The result records every refusal and the copies the session will insert where tensors cross memory domains.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..contract.backend import Backend, NodeInfo
from ..contract.errors import HeteroError, UnsupportedOp
from ..contract.graph import Graph


@dataclass
class NodePlacement:
    index: int
    name: str
    op_type: str
    backend: str
    refusals: dict[str, str] = field(default_factory=dict)  # backend name -> reason it said no
    fallback: bool = False
    group: int | None = None  # index of the compiled group, for whole-graph backends
    implementation: str = ""  # what the kernel says it is, e.g. "numpy" for a reference run inside a backend


@dataclass(frozen=True)
class CopyEdge:
    value: str
    src: str
    dst: str


@dataclass
class Placement:
    nodes: list[NodePlacement]
    copies: list[CopyEdge]
    groups: list[tuple[str, list[int]]]  # (backend, node indices) compiled as one subgraph

    def counts(self) -> Counter[str]:
        return Counter(p.backend for p in self.nodes)

    def fallbacks(self) -> list[NodePlacement]:
        return [p for p in self.nodes if p.fallback]

    def fallback_summary(self) -> str:
        """'17/240 nodes on cpu: Cast×9, Range×3' — one clause per fallback backend."""
        parts = []
        by_backend: dict[str, Counter[str]] = {}
        for p in self.fallbacks():
            by_backend.setdefault(p.backend, Counter())[p.op_type] += 1
        for backend, ops in by_backend.items():
            listed = ", ".join(f"{op}×{n}" for op, n in ops.most_common())
            parts.append(f"{sum(ops.values())}/{len(self.nodes)} nodes on {backend}: {listed}")
        return "; ".join(parts)


def partition(graph: Graph, infos: list[NodeInfo], backends: list[Backend], preferred: set[str]) -> Placement:
    placements: list[NodePlacement | None] = [None] * len(graph.nodes)
    groups: list[tuple[str, list[int]]] = []
    for backend in backends:
        for group in backend.partition(graph, infos):
            members = [i for i in group if placements[i] is None]
            if not members:
                continue
            gid = len(groups)
            groups.append((backend.name, members))
            for i in members:
                node = graph.nodes[i]
                placements[i] = NodePlacement(
                    i, node.name, node.op_type, backend.name, fallback=backend.name not in preferred, group=gid
                )
    for i, info in enumerate(infos):
        if placements[i] is not None:
            continue
        refusals: dict[str, str] = {}
        for backend in backends:
            try:
                verdict = backend.supports(info)
            except HeteroError as exc:
                verdict_ok, reason = False, exc.message
            except Exception as exc:  # a backend bug must not hide the other backends
                verdict_ok, reason = False, f"supports() raised {type(exc).__name__}: {exc}"
            else:
                verdict_ok, reason = verdict.ok, verdict.reason
            if verdict_ok:
                placements[i] = NodePlacement(
                    i, info.node.name, info.op_type, backend.name, refusals, fallback=backend.name not in preferred
                )
                break
            refusals[backend.name] = reason or "not supported"
        if placements[i] is None:
            reasons = "; ".join(f"{b}: {r}" for b, r in refusals.items())
            raise UnsupportedOp(f"no backend can run {info.node.label()} ({reasons})")
    final = [p for p in placements if p is not None]
    return Placement(final, _copies(graph, final, backends), groups)


def _copies(graph: Graph, placed: list[NodePlacement], backends: list[Backend]) -> list[CopyEdge]:
    domain = {b.name: b.memory_domain for b in backends}
    producer_backend: dict[str, str] = {}
    for p in placed:
        for out in graph.nodes[p.index].outputs:
            producer_backend[out] = p.backend
    copies: list[CopyEdge] = []
    seen: set[tuple[str, str]] = set()
    for p in placed:
        for name in graph.nodes[p.index].inputs:
            src = producer_backend.get(name, "host") if name not in graph.initializers else None
            if not name or src is None:
                continue
            src_domain = domain.get(src, "host")
            if src_domain != domain[p.backend] and (name, p.backend) not in seen:
                seen.add((name, p.backend))
                copies.append(CopyEdge(name, src, p.backend))
    for out in graph.outputs:
        src = producer_backend.get(out)
        if src is not None and domain.get(src, "host") != "host":
            copies.append(CopyEdge(out, src, "host"))
    return copies
