"""Session: load a model, place its nodes on backends, and run it.

Placement happens once, at construction. Kernels are prepared when input shapes change (shapes are inferred per
input signature by the same op schemas as at load time) and run on preallocated outputs. Tensors stay where their
backend put them; the session copies only where a value crosses memory domains, and downloads graph outputs.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import dtypes
from ..backend import Backend, Compiled, Kernel, NodeInfo
from ..errors import BackendError, FallbackError, HeteroError, HeteroWarning, InputError
from ..frontends import load
from ..ir import passes
from ..ir.graph import Graph, Node, free_names
from ..ops import registry
from ..ops.registry import OpSchema
from ..tensor import Tensor, TensorInfo
from .infer import fold_and_infer, infer_node
from .memory import ArenaPlan, Lifetime, plan_arena
from .partition import Placement, partition
from .replay import Recorder, Replay
from .selection import select

ON_FALLBACK = ("warn", "error", "silent")
# What a kernel raises (besides HeteroError) when a malformed model breaks one of its assumptions: re-raised as a
# BackendError naming the node and the backend.
KERNEL_FAILURES = (AttributeError, KeyError, TypeError, IndexError, ValueError, ArithmeticError, AssertionError,
                   RuntimeError, MemoryError)
# Ops whose output holds the input's data unchanged: on host memory the session makes a view instead of a copy.
VIEW_OPS = {("", "Reshape"), ("", "Flatten"), ("", "Squeeze"), ("", "Unsqueeze"), ("", "Identity")}


@dataclass
class _Step:
    backend: Backend
    inputs: list[str]
    outputs: list[str]
    node: Node | None = None  # kernel steps
    schema: OpSchema | None = None
    kernel: Kernel | None = None
    opset: int = 0
    compiled: Compiled | None = None  # compiled-subgraph steps
    outer: list[str] = field(default_factory=list)  # outer-scope names read by subgraph attributes
    has_subgraph: bool = False
    alias: bool = False  # a reshape-like node: its output is a view of its input when the backend can make one
    const_values: frozenset[int] = frozenset()  # value inputs that are initializers: keyed by name, never read
    key: Any = None
    out_infos: list[TensorInfo] = field(default_factory=list)
    infer_cache: dict[Any, list[TensorInfo]] = field(default_factory=dict)
    # Outputs that live in the arena are the same views every planned run: made once, reused (None: allocate).
    arena_outs: list[Tensor | None] | None = None


class Session:
    """A model ready to run on a set of backends.

    backends: names in preference order (``"opencl:1"`` picks a device); default ``HETERO_BACKENDS`` or every working
    backend. Nodes no listed backend supports fall back to ``cpu``, then to the numpy ``reference``.
    on_fallback: "warn" (one summary warning), "error" (raise ``FallbackError``) or "silent".
    optimize: run the graph passes (no-op removal, Conv+BatchNorm folding, activation and bias fusion).
    """

    def __init__(
        self,
        model: Any,
        backends: Sequence[str] | str | None = None,
        on_fallback: str = "warn",
        *,
        threads: int | None = None,
        optimize: bool = True,
        options: dict[str, Any] | None = None,
    ) -> None:
        if on_fallback not in ON_FALLBACK:
            raise HeteroError(f"on_fallback={on_fallback!r}; expected one of {ON_FALLBACK}")
        options = dict(options or {})
        if threads is not None:
            if threads < 1:
                raise HeteroError(f"threads={threads}; expected a positive number")
            options["threads"] = threads
        self._options = options
        # Child sessions of control-flow bodies, by id of the body graph (None: the body runs on the numpy evaluator).
        self._children: dict[int, Session | None] = {}
        started = time.perf_counter()
        # A Graph the caller passed stays theirs: the passes below rewrite a copy.
        self.graph: Graph = model.copy() if isinstance(model, Graph) else load(model)
        fold_and_infer(self.graph)
        self.rewrites: dict[str, int] = {}
        if optimize:
            self.rewrites = passes.optimize(self.graph)
            fold_and_infer(self.graph)  # infer the fused nodes, drop weights the rewrites orphaned
        selection = select(backends, options)
        self.backends = selection.backends
        self._by_name = {b.name: b for b in self.backends}
        self._infos = [self._node_info(node) for node in self.graph.nodes]
        self.placement: Placement = partition(self.graph, self._infos, self.backends, selection.preferred)
        self._report_fallback(on_fallback)
        self._steps = self._build_steps()
        self._weights: dict[tuple[str, str], Tensor] = {}
        self._last_use = self._liveness()
        # What each step is the last reader of, view sources included (a source outlives its own readers while a
        # view of it is still read, so it is freed with the view's last reader, not its own).
        self._frees: list[list[str]] = [[] for _ in self._steps]
        for name, last in self._last_use.items():
            if last < len(self._steps):
                self._frees[last].append(name)
        self._graph_outputs = set(self.graph.outputs)
        self._replayable = self._can_replay()
        self._replay: Replay | None = None
        # Intermediates of host backends live in one arena, planned from the first run of each input signature.
        self.memory_plan: ArenaPlan | None = None
        self._plan_signature: Any = None
        self._arena: np.ndarray | None = None
        self.load_seconds = time.perf_counter() - started

    # -- construction --------------------------------------------------------------------------------------------
    def _node_info(self, node: Node) -> NodeInfo:
        values = self.graph.values
        inputs = [values.get(n) if n else None for n in node.inputs]
        outputs = [values.get(n, TensorInfo(dtypes.float32, None)) for n in node.outputs]
        constants = {i: self.graph.initializers[n] for i, n in enumerate(node.inputs) if n in self.graph.initializers}
        return NodeInfo(node, inputs, outputs, constants, self.graph.opset(node.domain))

    def _report_fallback(self, on_fallback: str) -> None:
        fallbacks = self.placement.fallbacks()
        if not fallbacks or on_fallback == "silent":
            return
        if on_fallback == "error":
            lines = [
                f"{p.name} ({p.op_type}) -> {p.backend}: "
                + "; ".join(f"{b}: {r}" for b, r in p.refusals.items())
                for p in fallbacks
            ]
            raise FallbackError(
                f"{len(fallbacks)} node(s) cannot run on the requested backends:\n  " + "\n  ".join(lines),
                hint='pass on_fallback="warn" to let them fall back',
            )
        warnings.warn(f"hetero: {self.placement.fallback_summary()}", HeteroWarning, stacklevel=3)

    def _build_steps(self) -> list[_Step]:
        steps: list[_Step] = []
        group_done: set[int] = set()
        for placed, info in zip(self.placement.nodes, self._infos, strict=True):
            backend = self._by_name[placed.backend]
            node = info.node
            if placed.group is not None:
                if placed.group not in group_done:
                    group_done.add(placed.group)
                    steps.append(self._compile_group(backend, self.placement.groups[placed.group][1]))
                continue
            outer = [n for sub in node.attrs.values() if isinstance(sub, Graph) for n in free_names(sub)]
            try:
                kernel = backend.kernel(info)
            except KERNEL_FAILURES as exc:
                raise BackendError(f"{backend.name}: {node.label()}: the kernel cannot be made: "
                                   f"{type(exc).__name__}: {exc}") from exc
            placed.implementation = getattr(kernel, "implementation", "")
            steps.append(
                _Step(
                    backend,
                    list(node.inputs),
                    list(node.outputs),
                    node=node,
                    schema=registry.get(node.domain, node.op_type),
                    kernel=kernel,
                    opset=info.opset,
                    outer=outer,
                    has_subgraph=any(isinstance(a, Graph) for a in node.attrs.values()),
                    alias=node.op_key in VIEW_OPS and node.outputs[0] not in self.graph.outputs,
                    const_values=frozenset(i for i in registry.get(node.domain, node.op_type).value_inputs
                                           if i < len(node.inputs) and node.inputs[i] in self.graph.initializers),
                )
            )
        return steps

    def _compile_group(self, backend: Backend, members: list[int]) -> _Step:
        nodes = [self.graph.nodes[i] for i in members]
        produced = {o for n in nodes for o in n.outputs}
        read = [n for node in nodes for n in node.inputs if n and n not in produced]
        inputs = [n for n in dict.fromkeys(read) if n not in self.graph.initializers]
        consumed_later = {n for node in self.graph.nodes if node not in nodes for n in node.inputs}
        outputs = [o for o in dict.fromkeys(o for n in nodes for o in n.outputs) if o in consumed_later
                   or o in self.graph.outputs]
        sub = Graph(
            nodes=nodes,
            inputs=inputs,
            outputs=outputs,
            initializers={n: self.graph.initializers[n] for n in read if n in self.graph.initializers},
            values={n: self.graph.values[n] for n in [*inputs, *outputs] if n in self.graph.values},
            opsets=dict(self.graph.opsets),
            name=f"{backend.name}_group",
        )
        return _Step(backend, inputs, outputs, compiled=backend.compile(sub))

    def _liveness(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for i, step in enumerate(self._steps):
            for name in [*step.inputs, *step.outer]:
                if name:
                    last[name] = i
        for name in self.graph.outputs:
            last[name] = len(self._steps)
        # A view keeps its source's memory alive as long as the view itself is read (backwards: chains of views).
        for step in reversed(self._steps):
            if step.alias and step.inputs and step.inputs[0]:
                src, view = step.inputs[0], step.outputs[0]
                last[src] = max(last.get(src, 0), last.get(view, 0))
        return last

    def _can_replay(self) -> bool:
        """Whether a run's work is fixed by its input shapes alone (so a recorded run can be re-issued)."""
        for step in self._steps:
            if step.compiled is not None or step.has_subgraph or step.backend.memory_domain != "host":
                return False
            schema = step.schema
            assert schema is not None
            if schema.data_dependent:
                return False
            for i in schema.value_inputs:
                if i < len(step.inputs) and step.inputs[i] and step.inputs[i] not in self.graph.initializers:
                    return False
        return True

    # -- running ------------------------------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    def run(self, feeds: dict[str, Any], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run the model; returns the requested outputs (default: all) as numpy arrays."""
        tensors = self.run_tensors(feeds, outputs)
        return {name: np.asarray(t.numpy()) for name, t in tensors.items()}

    def run_tensors(self, feeds: dict[str, Any], outputs: Sequence[str] | None = None) -> dict[str, Tensor]:
        """Like ``run`` but leaves outputs where they were computed (device tensors stay on their device)."""
        wanted = list(outputs) if outputs is not None else self.graph.outputs
        for name in wanted:
            if name not in self.graph.outputs:
                raise InputError(f"{name!r} is not an output of the model; outputs: {self.graph.outputs}")
        env: dict[str, Tensor] = self._bind_inputs(feeds)
        # dtypes too: the replay copies feeds into buffers of its own, which must not cast
        signature = tuple((name, env[name].shape, env[name].dtype) for name in self.graph.inputs)
        if self._replay is not None and self._replay.signature == signature:
            return self._replay.run(env, wanted)
        copies: dict[tuple[str, str], Tensor] = {}
        planned = signature == self._plan_signature
        lifetimes: list[Lifetime] | None = None if planned else []
        recorder = Recorder(env) if planned and self._replayable else None
        self._replay = None
        for index, step in enumerate(self._steps):
            ins = [self._fetch(env, copies, name, step.backend) if name else None for name in step.inputs]
            if step.compiled is not None:
                results = step.compiled({n: t for n, t in zip(step.inputs, ins, strict=True) if t is not None})
                env.update(results)
            else:
                try:
                    self._run_kernel(step, ins, env, planned, recorder)
                except KERNEL_FAILURES as exc:  # a model breaking a kernel's assumptions: named, not a traceback
                    raise BackendError(f"{step.backend.name}: {step.node.label()}: {type(exc).__name__}: "  # type: ignore[union-attr]
                                       f"{exc}") from exc
                if lifetimes is not None and not step.alias:
                    self._record(lifetimes, index, step, env)
            self._release(env, copies, index)
        if lifetimes is not None:
            self._plan(signature, lifetimes)
        outputs = {name: self._output(env, name) for name in self.graph.outputs}
        if recorder is not None:
            self._replay = recorder.build(signature, outputs)
        return {name: outputs[name] for name in wanted}

    def _record(self, lifetimes: list[Lifetime], index: int, step: _Step, env: dict[str, Tensor]) -> None:
        if step.backend.memory_domain != "host":
            return
        for name in step.outputs:
            tensor = env.get(name)
            if name and tensor is not None and name not in self._graph_outputs and tensor.dtype.np_dtype is not None:
                nbytes = tensor.dtype.nbytes(tensor.size)
                lifetimes.append(Lifetime(name, nbytes, index, self._last_use.get(name, index)))

    def _plan(self, signature: Any, lifetimes: list[Lifetime]) -> None:
        self.memory_plan = plan_arena(lifetimes)
        self._plan_signature = signature
        self._arena = np.empty(self.memory_plan.arena_bytes, dtype=np.uint8)
        for step in self._steps:
            step.arena_outs = None

    def _arena_view(self, step: _Step, name: str, info: TensorInfo) -> Tensor | None:
        """The arena slice planned for ``name``, or None when it has no slot or its size changed since planning."""
        plan = self.memory_plan
        if plan is None or name not in plan.offsets or step.backend.memory_domain != "host":
            return None
        np_dtype = info.dtype.np_dtype
        nbytes = info.dtype.nbytes(int(np.prod(info.shape, dtype=np.int64)))  # type: ignore[arg-type]
        if np_dtype is None or nbytes != plan.sizes[name]:
            return None
        offset = plan.offsets[name]
        view = self._arena[offset:offset + nbytes].view(np_dtype).reshape(info.shape)  # type: ignore[index]
        return Tensor(view, info.shape, info.dtype, step.backend)  # type: ignore[arg-type]

    def _run_kernel(self, step: _Step, ins: list[Tensor | None], env: dict[str, Tensor], planned: bool,
                    recorder: Recorder | None = None) -> None:
        assert step.node is not None and step.schema is not None and step.kernel is not None
        schema = step.schema
        # dtypes too: a value typed only at run time (untyped If / Scan bodies) may change dtype, not shape
        key = tuple(None if t is None else (t.shape, t.dtype.name) for t in ins)
        if schema.value_inputs:
            key += tuple(step.inputs[i] if i in step.const_values else _value_key(ins[i])
                         for i in schema.value_inputs if i < len(ins))
        run_subgraph = self._subgraph_runner(step, env) if step.has_subgraph else None
        if schema.data_dependent and hasattr(step.kernel, "run_dynamic"):
            # Output shapes come from the data: the kernel computes once and sizes its outputs itself (no infer pass
            # that would have to compute the same thing first).
            outs = step.kernel.run_dynamic(ins, run_subgraph=run_subgraph)
            for name, out in zip(step.outputs, outs, strict=False):
                if name:
                    env[name] = out
            return
        if key != step.key or schema.data_dependent:
            infos = [None if t is None else t.info for t in ins]
            if schema.data_dependent:
                values = [None if t is None else t.numpy() for t in ins]
            else:
                values = [None] * len(ins)
                for i in schema.value_inputs:
                    if i < len(ins) and ins[i] is not None:
                        values[i] = ins[i].numpy()
            cached = None if schema.data_dependent else step.infer_cache.get(key)
            if cached is None:
                cached = infer_node(schema, step.node, infos, values, step.opset, run_subgraph)
                if len(step.infer_cache) >= 8:  # prefill and decode alternate: keep a few signatures
                    step.infer_cache.pop(next(iter(step.infer_cache)))
                step.infer_cache[key] = cached
            step.out_infos = cached
            step.kernel.prepare(infos, step.out_infos)
            step.key = key
            step.arena_outs = None
        if step.alias:
            src = ins[0]
            assert src is not None
            view = step.backend.view(src, step.out_infos[0])
            if view is not None:
                env[step.outputs[0]] = view
                if recorder is not None:
                    recorder.view(src, view, step.backend)
                return
        if planned:
            if step.arena_outs is None:
                step.arena_outs = [self._arena_view(step, name, info) for name, info in
                                   zip(step.outputs, step.out_infos, strict=False)]
            outs = [t if t is not None else step.backend.empty(info)
                    for t, info in zip(step.arena_outs, step.out_infos, strict=True)]
        else:
            outs = [step.backend.empty(info) for info in step.out_infos]
        if run_subgraph is not None:
            step.kernel.run(ins, outs, run_subgraph=run_subgraph)  # type: ignore[call-arg]
        else:
            step.kernel.run(ins, outs)
        if recorder is not None:
            fresh = [t is None for t in step.arena_outs or [None] * len(outs)]
            recorder.call(step.kernel, ins, outs, fresh, step.out_infos, step.backend)
        for name, out in zip(step.outputs, outs, strict=False):
            if name:
                env[name] = out

    def _subgraph_runner(self, step: _Step, env: dict[str, Tensor]):
        """Runs a subgraph attribute (If/Loop/Scan body) with the enclosing graph's values in scope: as a child
        session on this session's backends (made once per body, so it plans, fuses and replays like any model),
        or with the numpy evaluator when the body cannot stand alone (e.g. untyped Loop inputs)."""
        from .evaluate import run_graph

        scope = {n: env[n].numpy() for n in step.outer if n in env}
        scope.update({n: np.asarray(self.graph.initializers[n]) for n in step.outer if n in self.graph.initializers})

        def run_subgraph(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            values = {**scope, **feeds}
            child = self._child_session(graph, values)
            if child is not None:
                try:
                    results = child.run({name: values[name] for name in child.input_names})
                    return [results[name] for name in graph.outputs]
                except InputError:  # the body's inputs changed dtype or rank since the child was made
                    self._children[id(graph)] = None
            return run_graph(graph, values)

        return run_subgraph

    def _child_session(self, body: Graph, values: dict[str, np.ndarray]) -> Session | None:
        """A session for a control-flow body, made at its first run: inputs are its own plus the outer values it
        reads (outer weights become its constants), typed by the values it was first given (dims left free, so later
        calls may change them)."""
        key = id(body)
        if key not in self._children:
            self._children[key] = None
            outer = [n for n in free_names(body) if n not in body.inputs]
            # Outer weights stay constants in the child (kernels pack them); other outer values become inputs.
            weights = {n: self.graph.initializers[n] for n in outer if n in self.graph.initializers}
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
                    self._children[key] = Session(standalone, backends=[b.name for b in self.backends],
                                                  on_fallback="silent", options=self._options)
        return self._children[key]

    def _bind_inputs(self, feeds: dict[str, Any]) -> dict[str, Tensor]:
        if not isinstance(feeds, dict):
            raise InputError(f"inputs must be a dict of name -> array, got {type(feeds).__name__}")
        unknown = [n for n in feeds if n not in self.graph.inputs]
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model's inputs are {self.graph.inputs}")
        env: dict[str, Tensor] = {}
        for name in self.graph.inputs:
            info = self.graph.values.get(name)
            if name not in feeds:
                raise InputError(f"missing input {name!r} ({info})")
            value = feeds[name]
            tensor = value if isinstance(value, Tensor) else Tensor.from_numpy(np.asarray(value))
            if info is not None:
                _check_input(name, tensor, info)
            env[name] = tensor
        return env

    def _fetch(self, env: dict[str, Tensor], copies: dict[tuple[str, str], Tensor], name: str, backend: Backend):
        tensor = env.get(name)
        if tensor is None:
            tensor = self._weight(name, backend)
        domain = "host" if tensor.backend is None else tensor.backend.memory_domain
        if domain == backend.memory_domain:
            return tensor
        key = (name, backend.memory_domain)
        if key not in copies:
            moved = backend.copy(tensor)
            copies[key] = moved if moved is not None else backend.upload(tensor.numpy())
        return copies[key]

    def _weight(self, name: str, backend: Backend) -> Tensor:
        key = (name, backend.memory_domain)
        tensor = self._weights.get(key)
        if tensor is None:
            tensor = backend.upload(self.graph.initializers[name], kind="weights")
            self._weights[key] = tensor
        return tensor

    def _release(self, env: dict[str, Tensor], copies: dict[tuple[str, str], Tensor], index: int) -> None:
        for name in self._frees[index]:
            env.pop(name, None)
            for key in [k for k in copies if k[0] == name]:
                del copies[key]

    def _output(self, env: dict[str, Tensor], name: str) -> Tensor:
        if name in env:
            return env[name]
        if name in self.graph.initializers:  # an output folded to a constant
            return Tensor.from_numpy(np.asarray(self.graph.initializers[name]))
        raise HeteroError(f"output {name!r} was not computed")

    # -- reporting -----------------------------------------------------------------------------------------------
    def explain(self) -> str:
        """Node -> backend, each refusal and each copy, as a readable table."""
        rows = [("node", "op", "backend", "why not earlier backends")]
        for p in self.placement.nodes:
            why = "; ".join(f"{b}: {r}" for b, r in p.refusals.items())
            where = p.backend + (f" ({p.implementation})" if p.implementation else "")
            rows.append((p.name, p.op_type, where + (" (fallback)" if p.fallback else ""), why))
        widths = [max(len(r[c]) for r in rows) for c in range(3)]
        lines = [f"backends: {', '.join(b.name for b in self.backends)}"]
        lines += ["  ".join(r[c].ljust(widths[c]) for c in range(3)) + "  " + r[3] for r in rows]
        counts = ", ".join(f"{b}: {n}" for b, n in self.placement.counts().items())
        lines.append(f"nodes per backend: {counts}")
        if self.placement.copies:
            lines.append("copies:")
            lines += [f"  {c.value}: {c.src} -> {c.dst}" for c in self.placement.copies]
        else:
            lines.append("copies: none")
        return "\n".join(line.rstrip() for line in lines)

    def kernels(self) -> list[tuple[Node, Kernel]]:
        """(node, kernel) of every step that runs a kernel (views and compiled groups excluded): for profilers."""
        return [(s.node, s.kernel) for s in self._steps if s.node is not None and s.kernel is not None and not s.alias]

    def invalidate_replay(self) -> None:
        """Forget the recorded steady-state run (recorded again on the next planned run), e.g. after wrapping
        kernels' ``run`` for timing."""
        self._replay = None

    def close(self) -> None:
        for backend in self.backends:
            backend.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _value_key(tensor: Tensor | None) -> Any:
    if tensor is None:
        return None
    array = tensor.numpy()
    return (array.dtype.str, array.shape, array.tobytes())


def _check_input(name: str, tensor: Tensor, info: TensorInfo) -> None:
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
