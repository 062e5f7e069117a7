"""The backend plugin contract. A backend package implements these classes; the core never names a backend.

A package exposes, through the entry-point group ``hetero.backends``, a light pure-Python module (no native import
at its top) that states its own ``api_version`` (a literal: the version of this contract it was written for) and
implements the ``hetero_register_backends`` hook (see ``hookspecs.py``), registering one ``Factory``. Then:

* ``Factory.probe()`` lists the devices, or raises ``BackendUnavailable`` naming the missing driver and the fix;
* ``Factory.create(device, options)`` returns a ``Backend`` for one device;
* the session asks ``Backend.supports(node)`` for every node (after shape inference), cuts the placed graph into
  segments (maximal runs of nodes on one backend) and asks ``Backend.compile(segment)`` for a ``Program`` per
  segment. Kernel-table backends return None and get the core's default program (``hetero.runtime.executor``),
  which asks ``Backend.kernel(node)`` for each node: a ``Kernel`` is prepared when input shapes change (plan
  memory, choose the algorithm) and run on preallocated outputs (no allocation on the hot path). ``Kernel`` below
  lists every method the runtime calls. Whole-graph backends (NPUs) return their own program. Optional
  ``fuse_calls(program) -> program``: the replay hands a backend its recorded list of bound calls, to merge
  consecutive ones into fewer that do exactly the same (the cpu plugin's decode-step matmul fusions); optional
  ``after_replay()``: called after each replayed run (the cpu plugin keeps its pool's workers spinning for the next).
* memory: ``alloc``/``upload``/``download`` (and optional ``view``, ``copy``); ``synchronize`` at the end of each
  segment the session queued on an asynchronous device; ``close``. Backends that compute on host memory inherit
  ``HostMemory`` and then share buffers with each other without copies.

Read docs/backend-authors.md for a walk-through; ``hetero.reference`` is the smallest complete backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from . import dtypes
from .decoder import DecoderRequest, LlmDecoder
from .errors import BackendError
from .graph import Graph, Node
from .tensor import Tensor, TensorInfo, static_shape

# The contract's version. A plugin states the version it was written for; a different major version is refused
# before anything of the plugin runs (hetero.plugins). 2.0: the contract package, kernel factories taking their
# backend, memory_domain per class, no Backend.free.
API_VERSION = "2.0"


@dataclass(frozen=True)
class Device:
    """One device a factory found. ``properties`` holds backend-specific facts (fp16, subgroups, compute units)."""

    name: str
    kind: str = "cpu"  # cpu | gpu | npu | dsp
    vendor: str = ""
    memory_bytes: int | None = None
    properties: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Support:
    """A backend's answer to "can you run this node?", with the reason when it cannot."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


SUPPORTED = Support(True)


def unsupported(reason: str) -> Support:
    return Support(False, reason)


def dtype_check(node: NodeInfo, allowed: Iterable[dtypes.DType], backend: str,
                indices: Sequence[int] | None = None) -> Support:
    """Supported when the chosen inputs (default: all present) and every output have an allowed dtype; the refusal
    names the backend and what its kernels take."""
    allowed = tuple(allowed)
    picked = node.inputs if indices is None else [node.inputs[i] for i in indices if i < len(node.inputs)]
    for info in [*picked, *node.outputs]:
        if info is not None and info.dtype not in allowed:
            names = "/".join(d.name for d in allowed)
            return unsupported(f"{node.op_type} on {info.dtype} ({backend} kernels take {names})")
    return SUPPORTED


@dataclass
class NodeInfo:
    """A node as a backend sees it: the op and attributes, static tensor info, and constant input values."""

    node: Node
    inputs: list[TensorInfo | None]
    outputs: list[TensorInfo]
    constants: dict[int, np.ndarray]  # input index -> value, for inputs known at load time (weights)
    opset: int

    @property
    def op_type(self) -> str:
        return self.node.op_type

    @property
    def domain(self) -> str:
        return self.node.domain

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attrs.get(name, default)


SubgraphRunner = Callable[[Graph, dict[str, np.ndarray]], list[np.ndarray]]


class Kernel(Protocol):
    """One node on one backend: every method the runtime calls on a kernel.

    Required:

    * ``prepare(inputs, outputs)`` — called before the first ``run`` and again whenever the input shapes (or the
      values of the op's shape-deciding inputs) change, with the static infos of the inputs and of the outputs
      shape inference computed. Plan here: choose the algorithm, size scratch memory, upload constants.
    * ``run(inputs, outputs)`` — compute into ``outputs``: tensors the session allocated with the backend's
      ``empty``/``alloc`` (possibly slices of one arena), of the shapes ``prepare`` was given. Write into their
      buffers; never rebind ``Tensor.buffer``, allocate results or write the inputs, which other nodes read too
      (the conformance kit checks all three). An absent optional input is None.

    Optional (looked up with ``getattr``; a kernel without them is still complete):

    * ``run(inputs, outputs, run_subgraph=...)`` — nodes with a graph attribute (If / Loop / Scan bodies) are run
      with a keyword ``run_subgraph(graph, feeds) -> list[np.ndarray]`` that executes a body with the enclosing
      graph's values in scope (a ``SubgraphRunner``). Only kernels of such ops receive it.
    * ``run_dynamic(inputs, run_subgraph=None) -> list[Tensor]`` — for ops whose output shapes depend on the data
      (``OpSchema.data_dependent``: NonZero, Unique, If, Loop...): compute and return new output tensors, sized by
      the results, instead of ``prepare`` + ``run``. The one place a kernel allocates; results must not alias the
      inputs (the session frees inputs at their last reader).
    * ``bind(inputs, outputs) -> Callable[[], None] | None`` — the session's steady-state replay
      (``hetero.runtime.replay``) asks for it once per recorded step: a zero-argument callable doing what
      ``run(inputs, outputs)`` does on these exact tensors, whose buffers stay while their contents change (read
      values such as ``past_len`` at call time), or a list of such callables called in order (one per device
      launch). None, or no ``bind``: the replay calls ``run``. A program keeps replays of several input
      signatures, so the call must stay valid after the kernel is prepared (and bound) for other shapes.
    * ``bind_guarded(inputs, outputs) -> Callable[[], None] | None`` — ``bind`` for a guarded replayed step (a
      kernel with ``values_at_run`` whose value inputs, or output shapes, follow the data: a Tile by counts from a
      NonZero, the NonZero itself): the call reads those values from the buffers at each call and raises
      ``ValueError`` where they give other output shapes than ``outputs``' (the replay then interprets). None, or
      no ``bind_guarded``: the replay calls ``run`` at each run.
    * ``export_state(slot, length) -> dict[str, np.ndarray]`` / ``import_state(slot, length, state)`` — a stateful
      kernel's (Attention's KV cache, GatedDeltaRule's recurrent state) state after the first ``length`` positions
      of sequence ``slot`` as arrays, and back into a kernel of the same node (of this or another session of the
      same model): what ``hetero.llm.snapshot`` (the prefix cache) copies. Without them a model has no snapshots.
    * ``implementation: str`` — what the kernel is when it is not the backend's own (``"numpy"`` for the
      reference run inside a backend); shown by ``Session.explain()`` and ``hetero ops``.
    """

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None: ...

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None: ...


@dataclass
class Segment:
    """A maximal run of consecutive nodes the session placed on one backend: the unit a backend compiles.

    ``graph`` holds the nodes; its inputs are the values read from outside (graph inputs and earlier segments'
    outputs, already in this backend's memory domain when the program runs), its initializers the weights they read,
    its outputs what later segments read or the caller gets back (``returned``: never placed in memory a later run
    reuses).
    """

    index: int
    graph: Graph
    nodes: list[NodeInfo]
    returned: frozenset[str] = frozenset()


class Program(Protocol):
    """A compiled segment: ``run`` takes the segment's inputs by name and returns its outputs by name. It prepares
    itself when input shapes change and runs without allocating while they stay the same."""

    def run(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]: ...


class Backend:
    """One device instance of a backend. Subclass it; override what your hardware does.

    A session holds at most one instance per backend name (``"opencl:1"`` picks the device), so ``memory_domain``
    is a class attribute: ``"host"`` for numpy memory that every host backend reads directly, or a name of the
    backend's own (``"opencl"``) for device memory, which other backends reach through copies at segment edges.
    """

    name: ClassVar[str] = "backend"
    memory_domain: ClassVar[str] = "host"

    # Session options this backend reads (beside the core's ``threads``): other keys are refused, naming these.
    option_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, device: Device, options: dict[str, Any] | None = None) -> None:
        self.device = device
        self.options = dict(options or {})

    # -- what runs where ---------------------------------------------------------------------------------------
    def supports(self, node: NodeInfo) -> Support:
        raise NotImplementedError

    def kernel(self, node: NodeInfo) -> Kernel:
        raise NotImplementedError

    def takes_op_type(self, domain: str, op_type: str) -> bool:
        """Whether some node of this op type can run here (``supports`` then judges each node). The session applies
        a graph rewrite to a fused op (``hetero.ir.passes.FUSED_OPS``) only when the first-choice backend takes the
        fused op: otherwise the written-out nodes stay on it rather than one fused node falling back. True (the
        default) for a backend that does not say: every fusion then applies, as before this method existed."""
        return True

    def compile(self, segment: Segment) -> Program | None:
        """This backend's program for a segment of nodes it accepted in ``supports``. None (the default): the core's
        program runs the segment node by node through ``kernel()``, with arena planning and replay. Whole-graph
        backends (NPUs) override this and return their own."""
        return None

    def llm_decoder(self, request: DecoderRequest) -> LlmDecoder | None:
        """A whole LLM decoder compiled by this backend (``hetero.contract.decoder``), or None (the default): the
        model then runs as hetero's graph through a session. Raise ``UnsupportedOp`` naming what this backend's
        decoder does not cover (the model then runs through a session too, with a warning)."""
        return None

    # -- memory --------------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int, kind: str = "arena") -> Any:
        """A buffer of ``nbytes``; ``kind`` is weights | arena | scratch, a hint for where it should live. The buffer
        is released when the last tensor holding it is dropped (a device backend frees in its buffer's finalizer)."""
        raise NotImplementedError

    def empty(self, info: TensorInfo) -> Tensor:
        shape = static_shape(info)
        numel = int(np.prod(shape, dtype=np.int64))
        return Tensor(self.alloc(info.dtype.nbytes(numel)), shape, info.dtype, self)

    def upload(self, array: np.ndarray, kind: str = "arena") -> Tensor:
        raise NotImplementedError

    def download(self, tensor: Tensor) -> np.ndarray:
        raise NotImplementedError

    def view(self, tensor: Tensor, info: TensorInfo) -> Tensor | None:
        """A tensor of ``info``'s shape sharing ``tensor``'s memory (Reshape, Flatten, Squeeze...), or None when the
        backend cannot; then the op's kernel runs (a copy)."""
        return None

    def write(self, dst: Tensor, src: Tensor) -> None:
        """Overwrite ``dst`` (a tensor of this backend) with ``src``'s values (same shape and dtype; host memory or
        this backend's): how the replay refills its own input buffers. Backends without it are not replayed."""
        raise NotImplementedError

    # Arena: backends that return tensors here get their intermediates planned into one buffer from ``alloc(n,
    # "arena")``, offsets aligned to ``arena_align`` bytes. None (the default): outputs come from ``empty`` each run.
    arena_align: int = 64
    # Whether the executor may plan a Concat's inputs inside its output and a Split's outputs inside its input (batch
    # of one, so each part is contiguous) and skip those nodes: every kernel then reads and writes arena tensors at
    # any ``arena_align``-aligned offset, next to values other kernels write. Host backends opt in (the cpu plugin).
    arena_slices: bool = False
    # Whether this backend computes float16 nodes in float32 anyway (no half arithmetic: the cpu plugin's HalfUpcast):
    # then a session whose first backend it is keeps float16 chains in float32 (passes.float16_chains_to_float32).
    float16_via_float32: bool = False

    def arena_tensor(self, arena: Any, offset: int, info: TensorInfo) -> Tensor | None:
        """A tensor of ``info`` sharing ``arena``'s memory from ``offset`` bytes on, or None."""
        return None

    def copy(self, tensor: Tensor) -> Tensor | None:
        """Copy a tensor of another backend directly (peer copy); None lets the core go through the host."""
        return None

    def synchronize(self) -> None:
        """Wait until the work queued on the device so far is done. The session calls it at the end of each
        segment it ran on this backend, before anything else reads the results; asynchronous devices override it,
        host backends need not (the default returns at once)."""

    def close(self) -> None:
        """Release device resources; the backend is not used afterwards."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} on {self.device}>"


class HostMemory(Backend):
    """Memory methods for backends that compute on ordinary host memory (numpy arrays)."""

    def alloc(self, nbytes: int, kind: str = "arena") -> np.ndarray:
        # numpy's buffers start 16 bytes into a line: the arena's offsets (multiples of arena_align) are cache-line
        # aligned only from an aligned start (else kernels splitting an output by columns share its lines).
        raw = np.empty(nbytes + self.arena_align, dtype=np.uint8)
        start = -raw.ctypes.data % self.arena_align
        return raw[start:start + nbytes]

    def empty(self, info: TensorInfo) -> Tensor:
        shape = static_shape(info)
        if info.dtype.np_dtype is None:
            raise BackendError(f"host tensors of {info.dtype} need a backend that knows its layout")
        try:
            array = np.empty(shape, dtype=info.dtype.np_dtype)
        except (MemoryError, ValueError) as exc:
            raise BackendError(f"cannot allocate a {info} tensor on the host: {exc}") from exc
        return Tensor(array, shape, info.dtype, self)

    def upload(self, array: np.ndarray, kind: str = "arena") -> Tensor:
        array = np.asarray(array)
        return Tensor(array, array.shape, dtypes.from_numpy(array.dtype), self)

    def download(self, tensor: Tensor) -> np.ndarray:
        return tensor.buffer

    def write(self, dst: Tensor, src: Tensor) -> None:
        np.copyto(dst.buffer, src.numpy())

    def arena_tensor(self, arena: Any, offset: int, info: TensorInfo) -> Tensor | None:
        np_dtype = info.dtype.np_dtype
        if np_dtype is None:
            return None
        shape = static_shape(info)
        nbytes = info.dtype.nbytes(int(np.prod(shape, dtype=np.int64)))
        view = arena[offset:offset + nbytes].view(np_dtype).reshape(shape)
        return Tensor(view, shape, info.dtype, self)

    def view(self, tensor: Tensor, info: TensorInfo) -> Tensor | None:
        array = tensor.numpy()
        if not array.flags.c_contiguous:
            return None  # a reshape would copy: let the kernel do it
        shape = static_shape(info)
        return Tensor(array.reshape(shape), shape, info.dtype, self)


# A kernel table entry: called with the node and the backend instance the kernel will run on (a kernel class taking
# ``(node, backend)`` is one). It may define a static ``accepts(node) -> Support`` to refuse configurations.
KernelFactory = Callable[[NodeInfo, Backend], Kernel]


class Factory:
    """One per backend package: finds devices and creates backends. Must be cheap to construct (no native import)."""

    name: ClassVar[str] = "backend"
    # The contract version this factory was written for; None: the one its plugin module states (``api_version``).
    api_version: ClassVar[str | None] = None
    # The order of backends when the user names none: lower is asked first (accelerators < 50, cpu 50, the numpy
    # reference 100). It orders, nothing more: what counts as a fallback is what the user did not ask for.
    priority: ClassVar[int] = 50

    def probe(self) -> list[Device]:
        raise NotImplementedError

    def create(self, device: Device, options: dict[str, Any] | None = None) -> Backend:
        raise NotImplementedError


# Kernels other plugins add to a table backend (the ``hetero_register_kernels`` hook), by backend name. Discovery
# (``hetero.plugins``) fills this table before it creates any backend; nothing in the contract starts discovery.
_added_kernels: dict[str, dict[tuple[str, str], KernelFactory]] = {}


def add_kernel(backend_name: str, domain: str, op_type: str, factory: KernelFactory) -> None:
    """Add a kernel to the table of the backend named ``backend_name`` (what the hook's ``register`` does)."""
    _added_kernels.setdefault(backend_name, {})[(domain, op_type)] = factory


def forget_added_kernels() -> None:
    """Drop every added kernel (discovery starts again: ``hetero.plugins.reload``)."""
    _added_kernels.clear()


class KernelTableBackend(Backend):
    """A backend whose kernels are looked up by op in a table; kernels registered by other plugins join it.

    Table entries are ``KernelFactory``s: kernel classes (or functions) called with ``(node, backend)``; a class may
    define a static ``accepts(node) -> Support`` to refuse particular dtypes or attributes.
    """

    kernels: ClassVar[dict[tuple[str, str], KernelFactory]] = {}

    def kernel_table(self) -> dict[tuple[str, str], KernelFactory]:
        """Every kernel this backend has, its own and the ones other plugins added, by ``(domain, op_type)``."""
        return {**self.kernels, **_added_kernels.get(self.name, {})}

    def _factory(self, domain: str, op_type: str) -> KernelFactory | None:
        """The table's entry for one op, without merging the whole table (asked once per node of every session)."""
        key = (domain, op_type)
        added = _added_kernels.get(self.name)
        if added is not None and key in added:
            return added[key]
        return self.kernels.get(key)

    def supports(self, node: NodeInfo) -> Support:
        factory = self._factory(node.domain, node.op_type)
        if factory is None:
            return unsupported(f"no {self.name} kernel for {node.op_type}")
        accepts = getattr(factory, "accepts", None)
        if accepts is None:
            return SUPPORTED
        try:
            return accepts(node)
        except (AttributeError, KeyError, TypeError, IndexError, ValueError) as exc:
            # the check tripped on a malformed node (an input missing, an attribute of the wrong type): not taken
            # here; the reference's shape inference names what is wrong
            return unsupported(f"{node.op_type}: {type(exc).__name__} in the kernel's check: {exc}")

    def kernel(self, node: NodeInfo) -> Kernel:
        factory = self._factory(node.domain, node.op_type)
        if factory is None:
            raise KeyError((node.domain, node.op_type))  # what indexing the merged table raised
        return factory(node, self)

    def takes_op_type(self, domain: str, op_type: str) -> bool:
        return self._factory(domain, op_type) is not None
