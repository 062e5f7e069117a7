"""The backend plugin contract. A backend package implements these classes; the core never names a backend.

A package exposes, through the entry-point group ``hetero.backends``, a light pure-Python module (no native import
at its top) that states ``api_version`` and implements the ``hetero_register_backends`` hook (see
``hookspecs.py``), registering one ``Factory``. Then:

* ``Factory.probe()`` lists the devices, or raises ``BackendUnavailable`` naming the missing driver and the fix;
* ``Factory.create(device, options)`` returns a ``Backend`` for one device;
* the session asks ``Backend.supports(node)`` for every node (after shape inference), then ``Backend.kernel(node)``
  for those it got. A ``Kernel`` is prepared when input shapes change (plan memory, choose the algorithm) and run
  on preallocated outputs (no allocation on the hot path).
* memory: ``alloc``/``free``/``upload``/``download`` (and optional ``copy``). Backends that compute on host memory
  inherit ``HostMemory`` and then share buffers with each other without copies.

Read docs/backend-authors.md for a walk-through; ``hetero.reference`` is the smallest complete backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from . import dtypes
from .errors import BackendError
from .ir.graph import Graph, Node
from .tensor import Tensor, TensorInfo

API_VERSION = "1.0"


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


class Kernel(Protocol):
    """One node on one backend. ``prepare`` runs when input shapes change; ``run`` must not allocate.

    Optional, not part of the protocol's required methods: ``bind(inputs, outputs) -> Callable[[], None] | None``.
    The session's steady-state replay (``hetero.runtime.replay``) asks for it once per recorded step: a
    zero-argument callable doing what ``run(inputs, outputs)`` does on these exact tensors, whose buffers stay while
    their contents change (read values such as ``past_len`` at call time). None, or no ``bind``: the replay calls
    ``run``.
    """

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None: ...

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None: ...


class Compiled(Protocol):
    """A whole subgraph compiled by a graph-level backend (NPUs): called with and returning named tensors."""

    def __call__(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]: ...


class Backend:
    """One device instance of a backend. Subclass it; override what your hardware does."""

    name: ClassVar[str] = "backend"
    # Backends in the same memory domain read each other's tensors directly; others get copies at boundaries.
    memory_domain: ClassVar[str] = "host"

    def __init__(self, device: Device, options: dict[str, Any] | None = None) -> None:
        self.device = device
        self.options = dict(options or {})

    # -- what runs where ---------------------------------------------------------------------------------------
    def supports(self, node: NodeInfo) -> Support:
        raise NotImplementedError

    def kernel(self, node: NodeInfo) -> Kernel:
        raise NotImplementedError

    # Whole-graph backends override these two: partition() returns groups of node indices they claim, each group is
    # then compiled once. The default claims nothing, and nodes go one by one through supports()/kernel().
    def partition(self, graph: Graph, infos: Sequence[NodeInfo]) -> list[list[int]]:
        return []

    def compile(self, subgraph: Graph) -> Compiled:
        raise NotImplementedError(f"{self.name} does not compile subgraphs")

    # -- memory --------------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int, kind: str = "arena") -> Any:
        """A buffer of ``nbytes``; ``kind`` is weights | arena | scratch, a hint for where it should live."""
        raise NotImplementedError

    def free(self, buffer: Any) -> None:
        """Release a buffer from ``alloc``; the default lets garbage collection do it."""

    def empty(self, info: TensorInfo) -> Tensor:
        assert info.shape is not None and info.is_static, info
        numel = int(np.prod(info.shape, dtype=np.int64))
        return Tensor(self.alloc(info.dtype.nbytes(numel)), info.shape, info.dtype, self)

    def upload(self, array: np.ndarray, kind: str = "arena") -> Tensor:
        raise NotImplementedError

    def download(self, tensor: Tensor) -> np.ndarray:
        raise NotImplementedError

    def view(self, tensor: Tensor, info: TensorInfo) -> Tensor | None:
        """A tensor of ``info``'s shape sharing ``tensor``'s memory (Reshape, Flatten, Squeeze...), or None when the
        backend cannot; then the op's kernel runs (a copy)."""
        return None

    def copy(self, tensor: Tensor) -> Tensor | None:
        """Copy a tensor of another backend directly (peer copy); None lets the core go through the host."""
        return None

    def synchronize(self) -> None:
        """Wait for queued work (asynchronous devices)."""

    def close(self) -> None:
        """Release device resources; the backend is not used afterwards."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} on {self.device}>"


class HostMemory:
    """Memory methods for backends that compute on ordinary host memory (numpy arrays)."""

    def alloc(self, nbytes: int, kind: str = "arena") -> np.ndarray:
        return np.empty(nbytes, dtype=np.uint8)

    def empty(self, info: TensorInfo) -> Tensor:
        assert info.shape is not None and info.is_static, info
        if info.dtype.np_dtype is None:
            raise BackendError(f"host tensors of {info.dtype} need a backend that knows its layout")
        try:
            array = np.empty(info.shape, dtype=info.dtype.np_dtype)  # type: ignore[arg-type]
        except (MemoryError, ValueError) as exc:
            raise BackendError(f"cannot allocate a {info} tensor on the host: {exc}") from exc
        return Tensor(array, info.shape, info.dtype, self)  # type: ignore[arg-type]

    def upload(self, array: np.ndarray, kind: str = "arena") -> Tensor:
        array = np.asarray(array)
        return Tensor(array, array.shape, dtypes.from_numpy(array.dtype), self)  # type: ignore[arg-type]

    def download(self, tensor: Tensor) -> np.ndarray:
        return tensor.buffer

    def view(self, tensor: Tensor, info: TensorInfo) -> Tensor | None:
        array = tensor.numpy()
        if not array.flags.c_contiguous:
            return None  # a reshape would copy: let the kernel do it
        return Tensor(array.reshape(info.shape), info.shape, info.dtype, self)  # type: ignore[arg-type]


KernelFactory = Callable[[NodeInfo], Kernel]


class Factory:
    """One per backend package: finds devices and creates backends. Must be cheap to construct (no native import)."""

    name: ClassVar[str] = "backend"
    api_version: ClassVar[str] = API_VERSION
    # Lower runs first when the user gives no order: accelerators < 50, cpu 50, the numpy reference 100.
    priority: ClassVar[int] = 50

    def probe(self) -> list[Device]:
        raise NotImplementedError

    def create(self, device: Device, options: dict[str, Any] | None = None) -> Backend:
        raise NotImplementedError


class KernelTableBackend(Backend):
    """A backend whose kernels are looked up by op in a table; kernels registered by other plugins join it.

    Table entries are kernel classes (or factories) taking a ``NodeInfo``; a class may define a static
    ``accepts(node) -> Support`` to refuse particular dtypes or attributes.
    """

    kernels: ClassVar[dict[tuple[str, str], KernelFactory]] = {}

    def _table(self) -> dict[tuple[str, str], KernelFactory]:
        from . import plugins  # extra kernels from other plugins, registered by backend name

        return {**self.kernels, **plugins.extra_kernels(self.name)}

    def supports(self, node: NodeInfo) -> Support:
        factory = self._table().get((node.domain, node.op_type))
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
        return self._table()[(node.domain, node.op_type)](node)
