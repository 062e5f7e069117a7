"""Control flow: the bodies of If / Loop / Scan nodes run as child sessions on the parent's backends.

A kernel of a node with subgraph attributes receives ``run_subgraph(graph, feeds) -> outputs`` (numpy arrays in and
out). Each body becomes a child ``Session`` at its first run (so it is optimized, segmented, planned and replayed
like any model), or runs on the numpy evaluator when it cannot stand alone (e.g. untyped Loop inputs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from ..contract import dtypes
from ..contract.errors import HeteroError, InputError
from ..contract.graph import Graph, Node, free_names
from ..contract.tensor import Tensor, TensorInfo

SubgraphRunner = Callable[[Graph, dict[str, np.ndarray]], list[np.ndarray]]


class ChildSession(Protocol):
    """What a body's session offers (a ``Session``; passed in as a factory so this module need not import it)."""

    @property
    def input_names(self) -> list[str]: ...

    def run(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]: ...

    def run_step(self, feeds: dict[str, np.ndarray], token: object) -> dict[str, np.ndarray]: ...


class ControlFlow:
    """Makes and keeps the child sessions of one parent session's control-flow bodies."""

    def __init__(self, initializers: dict[str, np.ndarray], make_session: Callable[[Graph], ChildSession]) -> None:
        """make_session: a session on the parent's backends and options for a standalone body graph."""
        self._initializers = initializers
        self._make_session = make_session
        # by id of the body graph; None: the body runs on the numpy evaluator
        self._children: dict[int, ChildSession | None] = {}

    def runner(self, outer: Sequence[str], env: dict[str, Tensor]) -> SubgraphRunner:
        """``run_subgraph`` for one node, with the enclosing graph's values it reads (``outer``) in scope."""
        from .evaluate import run_graph

        scope = {n: env[n].numpy() for n in outer if n in env}
        scope.update({n: np.asarray(self._initializers[n]) for n in outer if n in self._initializers})
        # The body calls of one node's run are a series (``ChildSession.run_step``): the outer values are these
        # arrays throughout, and what a Loop body writes back unchanged comes back as the array it was given; nothing
        # writes them while the node runs (its kernel reads them, the body's replay copies them in).
        series = object()

        def run_subgraph(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            values = {**scope, **feeds}
            child = self._child(graph, values)
            if child is not None:
                try:
                    results = child.run_step({name: values[name] for name in child.input_names}, series)
                    return [results[name] for name in graph.outputs]
                except InputError:  # the body's inputs changed dtype or rank since the child was made
                    self._children[id(graph)] = None
            return run_graph(graph, values)

        return run_subgraph

    def branch_replay(self, node: Node, cond: Tensor) -> tuple[Any, list[str]] | None:
        """The replay that the child session of ``node``'s (an If) taken branch recorded last, and the branch's output
        names, for the parent's replay to inline; None unless that child is one replayed segment."""
        found = self.branch_program(node, cond)
        replay = None if found is None else getattr(found[0], "replay", None)
        return None if replay is None or found is None else (replay, found[1])

    def branch_program(self, node: Node, cond: Tensor) -> tuple[Any, list[str]] | None:
        """The one program (segment) of the child session of ``node``'s (an If) taken branch, and the branch's output
        names; None unless that child exists and is one segment."""
        branch = node.attrs.get("then_branch" if bool(np.asarray(cond.host_values()).reshape(-1)[0]) else "else_branch")
        child = self._children.get(id(branch))
        programs = getattr(child, "programs", None)
        if not isinstance(branch, Graph) or not programs or len(programs) != 1:
            return None
        return programs[0], list(branch.outputs)

    def _child(self, body: Graph, values: dict[str, np.ndarray]) -> ChildSession | None:
        """A session for a body, made at its first run: inputs are its own plus the outer values it reads (outer
        weights become its constants), typed by the values it was first given (dims left free, so later calls may
        change them)."""
        key = id(body)
        if key not in self._children:
            self._children[key] = None
            outer = [n for n in free_names(body) if n not in body.inputs]
            weights = {n: self._initializers[n] for n in outer if n in self._initializers}
            names = [*body.inputs, *(n for n in outer if n not in weights)]
            if all(n in values for n in names):
                infos = {n: TensorInfo(dtypes.from_numpy(np.asarray(values[n]).dtype),
                                       (None,) * np.ndim(values[n])) for n in names}
                standalone = body.copy()  # the child's passes rewrite nodes: the body stays as it was
                standalone.inputs = names
                standalone.initializers = {**weights, **body.initializers}
                standalone.values = {**body.values, **infos}
                standalone.outer_scope = frozenset()
                with contextlib.suppress(HeteroError):  # else the numpy evaluator runs the body
                    self._children[key] = self._make_session(standalone)
        return self._children[key]
