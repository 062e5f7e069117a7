"""Session: load a model, optimize it, place its nodes, cut them into segments, compile each, and run them.

Placement and segmenting happen once, at construction: each maximal run of nodes on one backend is a segment that
its backend compiles into a program (``Backend.compile``, else the core's ``executor.KernelProgram``). A run hands
each program its inputs, copying a value only where the plan made at construction says it crosses memory domains
(``explain()`` lists those copies), and downloads graph outputs that are left on a device.

A session may be shared by threads: runs take turns on a per-session lock. What a run touches is the session's own
mutable state — each program's arena (one buffer reused by every run of a signature), its prepared kernels (set per
input shapes), its shape cache and its recorded replay — so two unlocked runs overwrote each other's intermediates
(19 of 20 magika runs from 4 threads differed). Different sessions run concurrently (native kernels release the GIL).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import plugins
from ..contract import dtypes
from ..contract.backend import Backend, Kernel, NodeInfo, Program
from ..contract.errors import HeteroError, InputError
from ..contract.graph import Graph, Node
from ..contract.tensor import Tensor, TensorInfo
from ..frontends import load
from ..ir import passes
from ..progress import phase
from .control import ControlFlow
from .describe import ValueInfo, bind_inputs, check_opsets, check_options, explain, run_arguments, value_infos
from .executor import KernelProgram
from .infer import fold_and_infer
from .memory import ArenaPlan
from .partition import NodePlacement, Placement, partition, report_fallback
from .replay import Replay
from .segments import Edge, cut
from .selection import select

ON_FALLBACK = ("warn", "error", "silent")


class Session:
    """A model ready to run on a set of backends.

    backends: names in preference order (``"opencl:1"`` picks a device; ``"cpu,opencl"`` is split like the CLI's
    ``-b``); default ``HETERO_BACKENDS`` or every working backend. Nodes no listed backend supports fall back to
    ``cpu``, then to the numpy ``reference``.
    on_fallback: "warn" (one summary warning), "error" (raise ``FallbackError``) or "silent".
    optimize: run the graph passes (no-op removal, Conv+BatchNorm folding, activation and bias fusion).
    options: backend options (``threads``; the backends' ``option_keys``); unknown keys are an error.
    """

    def __init__(self, model: Any, backends: Sequence[str] | str | None = None, on_fallback: str = "warn", *,
                 threads: int | None = None, optimize: bool = True, options: dict[str, Any] | None = None) -> None:
        if on_fallback not in ON_FALLBACK:
            raise HeteroError(f"on_fallback={on_fallback!r}; expected one of {ON_FALLBACK}")
        options = dict(options or {})
        if threads is not None:
            if threads < 1:
                raise HeteroError(f"threads={threads}; expected a positive number")
            options["threads"] = threads
        started = time.perf_counter()
        plugins.load_plugins()  # before shape inference: the graph may use ops that plugins add
        # A Graph the caller passed stays theirs: the passes below rewrite a copy.
        self.graph: Graph = model.copy() if isinstance(model, Graph) else load(model)
        check_opsets(self.graph)
        self._outputs, self._zipmaps = _unzip_outputs(self.graph)
        selection = select(backends, options)
        chosen: tuple[passes.Pass, ...] = ()
        if optimize:
            first = selection.backends[0] if selection.backends else None
            chosen = passes.for_backend(lambda key: first is None or first.takes_op_type(*key),
                                        float16_via_float32=bool(getattr(first, "float16_via_float32", False)))
        # the 8-bit weights of a QDQ model's MatMuls and Convs stay 8-bit for fuse_qdq_matmul / fuse_qdq_conv (the
        # fold after the passes folds the rest)
        qdq = passes.fuse_qdq_matmul in chosen or passes.fuse_qdq_conv in chosen
        fold_and_infer(self.graph, keep=passes.quantized_weights(self.graph) if qdq else frozenset())
        self.rewrites: dict[str, int] = {}
        if optimize:
            self.rewrites = passes.optimize(self.graph, chosen)
            fold_and_infer(self.graph)  # infer the fused nodes, drop weights the rewrites orphaned
        self.backends = selection.backends
        check_options(options, (k for b in self.backends for k in b.option_keys))
        infos = [self._node_info(node) for node in self.graph.nodes]
        self.placement: Placement = partition(self.graph, infos, self.backends, selection.preferred)
        report_fallback(self.placement, on_fallback)
        names = [b.name for b in self.backends]
        self._control = ControlFlow(self.graph.initializers,
                                    lambda body: Session(body, backends=names, on_fallback="silent", options=options))
        self._weights: dict[tuple[str, str], Tensor] = {}
        self._edges: list[Edge] = cut(self.graph, infos, self.placement, {b.name: b for b in self.backends})
        placed = {id(self.graph.nodes[p.index]): p for p in self.placement.nodes}
        with phase("preparing kernels (repacking weights, building device programs)"):
            self.programs: list[Program] = [self._compile(edge, placed) for edge in self._edges]
        self._domains = {b.memory_domain for b in self.backends}
        self._lock = threading.RLock()  # runs take turns: see the module's docstring
        self._fast: _FastRun | None = None  # set by each checked run (_fast_path)
        # (token, replay, feeds) of the last run_step: the arrays that replay's input buffers hold (see run_step)
        self._fed: tuple[object, Replay, dict[str, np.ndarray]] | None = None
        self.load_seconds = time.perf_counter() - started

    def _node_info(self, node: Node) -> NodeInfo:
        values = self.graph.values
        inputs = [values.get(n) if n else None for n in node.inputs]
        outputs = [values.get(n, TensorInfo(dtypes.float32, None)) for n in node.outputs]
        constants = {i: self.graph.initializers[n] for i, n in enumerate(node.inputs) if n in self.graph.initializers}
        return NodeInfo(node, inputs, outputs, constants, self.graph.opset(node.domain))

    def _compile(self, edge: Edge, placed: dict[int, NodePlacement]) -> Program:
        program = edge.backend.compile(edge.segment)
        if program is None:
            program = KernelProgram(edge.segment, edge.backend, self._weight, self._control)
            for step in program.steps:
                placed[id(step.node)].implementation = getattr(step.kernel, "implementation", "")
        return program

    def _weight(self, name: str, backend: Backend) -> Tensor:
        key = (name, backend.memory_domain)
        tensor = self._weights.get(key)
        if tensor is None:
            tensor = self._weights[key] = backend.upload(self.graph.initializers[name], kind="weights")
        return tensor

    # -- inputs and outputs (onnxruntime's names beside hetero's) ------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self._outputs)

    def get_inputs(self) -> list[ValueInfo]:
        return value_infos(self.graph, self.graph.inputs)

    def get_outputs(self) -> list[ValueInfo]:
        tensors = iter(value_infos(self.graph, [n for n in self._outputs if n not in self._zipmaps]))
        return [ValueInfo(n, f"seq(map({_label_type(self._zipmaps[n][1])},tensor(float)))", []) if n in self._zipmaps
                else next(tensors) for n in self._outputs]

    def get_providers(self) -> list[str]:
        """The backends this session runs on, in preference order (onnxruntime's providers)."""
        return [b.name for b in self.backends]

    # -- running ------------------------------------------------------------------------------------------------
    def run(self, feeds: Any, second: Any = None, outputs: Sequence[str] | None = None) -> Any:
        """``run(feeds)`` / ``run(feeds, outputs=[...])``: a dict of numpy arrays (default: every output);
        ``run(output_names | None, feeds)`` as onnxruntime: a list in ``output_names`` order."""
        if self._zipmaps:
            return self._run_zipped(feeds, second, outputs)
        return self._run_plain(feeds, second, outputs)

    def _run_plain(self, feeds: Any, second: Any, outputs: Sequence[str] | None) -> Any:
        fast = self._fast
        if fast is not None:  # repeated calls of one signature: see _FastRun
            if type(feeds) is dict and (second is None or outputs is None):
                wanted = outputs if second is None else second
                wanted = fast.names if wanted is None else wanted
                arrays = self._run_fast(fast, feeds, wanted)
                if arrays is not None:  # one array per name (run_arrays): zip's strict check is a third of the build
                    return {wanted[0]: arrays[0]} if len(arrays) == 1 else dict(zip(wanted, arrays, strict=False))
            elif type(second) is dict and outputs is None:
                arrays = self._run_fast(fast, second, fast.names if feeds is None else feeds)
                if arrays is not None:
                    return arrays
        feeds, wanted, as_list = run_arguments(feeds, second, outputs)
        tensors = self.run_tensors(feeds, wanted)
        results = {name: np.asarray(t.numpy()) for name, t in tensors.items()}
        return list(results.values()) if as_list else results

    def _run_zipped(self, feeds: Any, second: Any, outputs: Sequence[str] | None) -> Any:
        """``run`` of a model whose ZipMap outputs the graph lacks (see ``_unzip_outputs``): the graph runs for the
        probabilities (its own fast path included), then each wanted ZipMap output becomes onnxruntime's list of
        one dict {label: float} per row."""
        feeds, wanted, as_list = run_arguments(feeds, second, outputs)
        names = self._outputs if wanted is None else list(wanted)
        internal = list(dict.fromkeys(self._zipmaps[n][0] if n in self._zipmaps else n for n in names))
        zipmaps = self._zipmaps
        arrays = self._run_plain(feeds, None, internal)
        results = {n: _zip_rows(arrays[zipmaps[n][0]], zipmaps[n][1], n) if n in zipmaps else arrays[n] for n in names}
        return list(results.values()) if as_list else results

    def run_step(self, feeds: dict[str, np.ndarray], token: object) -> dict[str, np.ndarray]:
        """``run(feeds)`` for one of a series of calls (a Loop's iterations, ``token`` the series' own object) whose
        caller promises that an array it passes again in the series, the same object, was not written since: the
        replay's input buffer still holds it, so it is neither checked nor copied again (SLANet's decoder step
        reads ~2.5 MB of carried weights and outer values that its body writes back unchanged: ~45 us of copies a
        step). Any other run in between, or another replay, ends the series' savings (every feed copied again)."""
        with self._lock:  # what the input buffers hold (_fed) is read, relied on and set in one turn
            fed, self._fed = self._fed, None
            fast = self._fast
            if fast is not None and type(feeds) is dict:
                kept: Container[str] = ()
                if fed is not None and fed[0] is token and fed[1] is fast.replay:
                    last = fed[2]
                    kept = {name for name, array in feeds.items() if last.get(name) is array}
                arrays = self._run_fast(fast, feeds, fast.names, kept)
                if arrays is not None:
                    self._fed = (token, fast.replay, dict(feeds))
                    return dict(zip(fast.names, arrays, strict=True))
            return self.run(feeds)

    def _run_fast(self, fast: _FastRun, feeds: dict[str, Any], wanted: Any,
                  kept: Container[str] = ()) -> list[np.ndarray] | None:
        """The ``wanted`` outputs, in that order, when ``feeds`` are exactly the numpy arrays of ``fast``'s signature,
        ``wanted`` a list or tuple of output names and the replay still the program's current one; else None (the
        caller takes the checked path, which also names what is wrong). ``kept``: feeds that the replay's input
        buffers hold already (``run_step``), neither checked nor copied."""
        if len(feeds) != len(fast.feeds) or (wanted is not fast.names and not (
                type(wanted) in (list, tuple) and all(name in fast.outputs for name in wanted)
                and len(set(wanted)) == len(wanted))):
            return None
        for name, shape, dtype in fast.feeds:
            if name in kept:
                continue
            array = feeds.get(name)
            if type(array) is not np.ndarray or array.shape != shape or (array.dtype is not dtype
                                                                          and array.dtype != dtype):
                return None
        for name, value in fast.keyed:
            if feeds[name].tobytes() != value:
                return None
        if fast.passed:  # outputs the program does not compute: constants, feeds passed through (a Loop body's)
            inner = [name for name in wanted if name not in fast.passed]
            with self._lock:
                self._fed = None  # a run without run_step's promise (run_step sets it again): its feeds in the buffers
                arrays = fast.program.run_arrays(fast.replay, feeds, inner, kept)
            if arrays is None:
                return None
            found = dict(zip(inner, arrays, strict=True))
            for name in wanted:
                if name not in found:
                    constant = fast.passed[name]
                    found[name] = feeds[name] if constant is None else constant
            return [found[name] for name in wanted]
        with self._lock:
            self._fed = None  # as above
            return fast.program.run_arrays(fast.replay, feeds, wanted, kept)

    def _fast_path(self, env: dict[str, Tensor]) -> _FastRun | None:
        """The fast path for runs like the one just made (feeds ``env``), where the whole model is one host program
        whose current replay takes numpy feeds and computes every output."""
        if len(self.programs) != 1 or not isinstance(self.programs[0], KernelProgram) \
                or any(copy for _, copy in self._edges[0].sources):
            return None
        program = self.programs[0]
        replay = program.fast_replay()
        if replay is None:
            return None
        # outputs not computed by the program, answered as the checked path does (_output): a constant's array, the
        # caller's own feed (a Loop body's carried weights, written back unchanged)
        passed: dict[str, np.ndarray | None] = {}
        for name in self.graph.outputs:
            if name in replay.outputs:
                continue
            if name in self.graph.initializers:
                passed[name] = np.asarray(self.graph.initializers[name])
            elif name in env and name in self.graph.inputs and type(env[name].buffer) is np.ndarray:
                passed[name] = None  # the feed itself
            else:
                return None
        kept = self._fast
        if kept is not None and kept.replay is replay and all(
                env[name].shape == shape for name, shape, _ in kept.feeds):
            return kept  # the same replay: the same signature (dtypes, the keyed values), a graph input unread by it
        feeds = []
        for name in self.graph.inputs:
            tensor = env[name]
            if not tensor.is_host or tensor.dtype.np_dtype is None:
                return None
            feeds.append((name, tensor.shape, tensor.dtype.np_dtype))
        keyed = tuple((name, env[name].host_values().tobytes()) for name in program.keyed_inputs)
        return _FastRun(program, replay, tuple(feeds), keyed, frozenset(self.graph.outputs), list(self.graph.outputs),
                        passed)

    def run_tensors(self, feeds: dict[str, Any], outputs: Sequence[str] | None = None) -> dict[str, Tensor]:
        """Like ``run`` but leaves outputs where they were computed (device tensors stay on their device)."""
        with self._lock:
            return self._run_tensors(feeds, outputs)

    def _run_tensors(self, feeds: dict[str, Any], outputs: Sequence[str] | None) -> dict[str, Tensor]:
        self._fed = None  # the replays' input buffers get this run's feeds
        wanted = list(outputs) if outputs is not None else self.graph.outputs
        for name in wanted:
            if name not in self.graph.outputs:
                raise InputError(f"{name!r} is not an output of the model; outputs: {self.graph.outputs}")
        env: dict[str, Tensor] = bind_inputs(self.graph, feeds)
        bound = dict(env)
        moved: dict[tuple[str, str], Tensor] = {}  # values copied into another domain, shared by later segments
        for edge, program in zip(self._edges, self.programs, strict=True):
            backend, domain = edge.backend, edge.backend.memory_domain
            ins = {}
            for name, copy in edge.sources:
                if copy:
                    tensor = moved.get((name, domain))
                    if tensor is None:
                        tensor = moved[name, domain] = _move(env[name], backend)
                    ins[name] = tensor
                else:
                    ins[name] = env[name]
            env.update(program.run(ins))
            backend.synchronize()  # asynchronous devices: the segment's results are complete from here on
            for name in edge.drop:
                env.pop(name, None)
                if moved:
                    for d in self._domains:
                        moved.pop((name, d), None)
        self._fast = self._fast_path(bound)
        return {name: self._output(env, name) for name in wanted}

    def _output(self, env: dict[str, Tensor], name: str) -> Tensor:
        if name in env:
            return env[name]
        if name in self.graph.initializers:  # an output folded to a constant
            return Tensor.from_numpy(np.asarray(self.graph.initializers[name]))
        raise HeteroError(f"output {name!r} was not computed")

    # -- reporting -----------------------------------------------------------------------------------------------
    def explain(self) -> str:
        """Node -> backend (and segment), each refusal, and the copies a run makes, as a readable table."""
        return explain(self.graph, self.backends, self.placement, [e.segment for e in self._edges])

    @property
    def memory_plan(self) -> ArenaPlan | None:
        """The arena plan of the first segment that has one (a one-backend model is one segment); every segment's
        is in ``memory_plans``."""
        return next((plan for _, plan in self.memory_plans), None)

    @property
    def memory_plans(self) -> list[tuple[str, ArenaPlan]]:
        """(backend name, arena plan) of each segment planned so far, in run order (an arena per segment: each
        lives in its own backend's memory)."""
        return [(getattr(getattr(p, "backend", None), "name", "?"), plan) for p in self.programs
                if (plan := getattr(p, "memory_plan", None)) is not None]

    def kernels(self) -> list[tuple[Node, Kernel]]:
        """(node, kernel) of every node run by a kernel (views excluded): for profilers."""
        return [(s.node, s.kernel) for p in self.programs if isinstance(p, KernelProgram) for s in p.steps
                if not s.alias]

    def invalidate_replay(self) -> None:
        """Forget the recorded steady-state runs (recorded again on the next planned run), e.g. after wrapping
        kernels' ``run`` for timing."""
        with self._lock:
            for program in self.programs:
                if isinstance(program, KernelProgram):
                    program.replay = None

    def close(self) -> None:
        with self._lock:  # not under a running call
            for backend in self.backends:
                backend.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class _FastRun:
    """``run`` of repeated calls with one signature without the checked path's work (argument forms, feeds bound to
    tensors and checked, the segment loop, the program's signature key): when the feeds are a dict of exactly the
    model's inputs as numpy arrays of the shapes and dtypes of the checked run that made it (which passed every
    check), and the same values in the inputs that select an If's branch (silero-vad's sample rate), the program's
    replay of that signature is issued directly (``KernelProgram.run_arrays``: still the current replay, else the
    checked path runs). Outputs are the caller's own arrays, as on the checked path."""

    program: KernelProgram
    replay: Replay
    feeds: tuple[tuple[str, tuple[int, ...], np.dtype], ...]  # (input name, shape, dtype), the graph's order
    keyed: tuple[tuple[str, bytes], ...]  # (input name, its values' bytes) of the program's value-keyed inputs
    outputs: frozenset[str]  # the model's outputs: a call may ask for any of them, in any order
    names: list[str]  # every output, the graph's order: what run(feeds) answers
    # outputs the replay does not compute: name -> a constant's array, or None for a feed passed through
    passed: dict[str, np.ndarray | None] = field(default_factory=dict)


def _unzip_outputs(graph: Graph) -> tuple[list[str], dict[str, tuple[str, list[Any]]]]:
    """(the graph's output names as the model gives them, its ZipMap outputs), the graph rewritten to output each
    ZipMap's probabilities instead: they are a tensor that the passes, placement and replay handle as any other."""
    outputs, zipmaps = list(graph.outputs), dict(graph.zipmaps)
    if zipmaps:
        graph.outputs = list(dict.fromkeys(zipmaps[n][0] if n in zipmaps else n for n in outputs))
        graph.zipmaps = {}
        graph.validate_outputs()
    return outputs, zipmaps


def _zip_rows(probabilities: np.ndarray, labels: list[Any], name: str) -> list[dict[Any, float]]:
    """ZipMap's value as onnxruntime gives it: per row a dict of Python label -> Python float, the labels in
    ascending order (onnxruntime fills a std::map, so its dicts come sorted by key, not in the model's order)."""
    rows = np.asarray(probabilities)
    if rows.ndim == 1:
        rows = rows[None]
    if rows.ndim != 2 or rows.shape[1] != len(labels):
        raise HeteroError(f"ZipMap output {name!r}: probabilities of shape {list(np.shape(probabilities))} do not "
                          f"match its {len(labels)} class labels")
    order = sorted(range(len(labels)), key=labels.__getitem__)
    keys = [labels[i] for i in order]
    # strict=False: the shape is checked above, and the strict check costs a third of a 256-row build
    return [dict(zip(keys, row, strict=False)) for row in rows[:, order].astype(np.float64).tolist()]


def _label_type(labels: list[Any]) -> str:
    return "string" if labels and isinstance(labels[0], str) else "int64"


def _move(tensor: Tensor, backend: Backend) -> Tensor:
    if tensor.backend is not None and tensor.backend.memory_domain == backend.memory_domain:
        return tensor  # a feed the caller passed already on this device
    moved = backend.copy(tensor)
    return moved if moved is not None else backend.upload(tensor.host_values())
