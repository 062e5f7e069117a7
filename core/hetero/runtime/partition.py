"""Partitioning: each node goes to the first backend (in preference order) that supports it.

Every backend, whole-graph ones (NPUs) included, answers ``supports`` node by node; the result records every refusal.
The copies between memory domains are planned with the segments (``segments.cut``) and stored here for reports.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field

from ..contract.backend import Backend, NodeInfo
from ..contract.errors import FallbackError, HeteroError, HeteroWarning, UnsupportedOp
from ..contract.graph import Graph


@dataclass
class NodePlacement:
    index: int
    name: str
    op_type: str
    backend: str
    refusals: dict[str, str] = field(default_factory=dict)  # backend name -> reason it said no
    fallback: bool = False
    implementation: str = ""  # what the kernel says it is, e.g. "numpy" for a reference run inside a backend


@dataclass(frozen=True)
class CopyEdge:
    value: str
    src: str
    dst: str


@dataclass
class Placement:
    nodes: list[NodePlacement]
    copies: list[CopyEdge] = field(default_factory=list)  # filled by segments.cut: exactly the copies a run makes

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
    placements: list[NodePlacement] = []
    for i, info in enumerate(infos):
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
                placements.append(NodePlacement(i, info.node.name, info.op_type, backend.name, refusals,
                                                fallback=backend.name not in preferred))
                break
            refusals[backend.name] = reason or "not supported"
        else:
            reasons = "; ".join(f"{b}: {r}" for b, r in refusals.items())
            raise UnsupportedOp(f"no backend can run {info.node.label()} ({reasons})")
    return Placement(placements)


def report_fallback(placement: Placement, on_fallback: str) -> None:
    """One summary warning ("warn"), a ``FallbackError`` listing every refusal ("error"), or nothing ("silent")."""
    fallbacks = placement.fallbacks()
    if not fallbacks or on_fallback == "silent":
        return
    if on_fallback == "error":
        lines = [f"{p.name} ({p.op_type}) -> {p.backend}: " + "; ".join(f"{b}: {r}" for b, r in p.refusals.items())
                 for p in fallbacks]
        raise FallbackError(f"{len(fallbacks)} node(s) cannot run on the requested backends:\n  " + "\n  ".join(lines),
                            hint='pass on_fallback="warn" to let them fall back')
    warnings.warn(f"hetero: {placement.fallback_summary()}", HeteroWarning, stacklevel=3)
