"""Pieces shared by the OpenCL kernels: the kernel base class, launch helpers, dtype checks and the activation
codes of ``cl/common.cl``."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from hetero.contract import SUPPORTED, NodeInfo, Support, Tensor, TensorInfo, dtypes, unsupported
from hetero.contract import dtype_check as backend_dtype_check
from hetero.contract.dtypes import DType
from hetero.contract.opforms import activation_known, activation_params

from ..runtime import Runtime

# Unary / activation codes: keep in sync with cl/common.cl (U_*).
UNARY = {
    "identity": 0, "relu": 1, "leaky_relu": 2, "elu": 3, "selu": 4, "celu": 5, "sigmoid": 6, "hard_sigmoid": 7,
    "hard_swish": 8, "tanh": 9, "softplus": 10, "softsign": 11, "exp": 12, "log": 13, "sqrt": 14, "neg": 15,
    "abs": 16, "reciprocal": 17, "erf": 18, "floor": 19, "ceil": 20, "round": 21, "sin": 22, "cos": 23, "mish": 24,
    "clip": 25, "gelu": 26, "gelu_tanh": 27, "silu": 28, "sign": 29, "thresholded_relu": 30, "tan": 31,
    "leaky_relu_min": 32,
}


def up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pow2_at_most(n: int, cap: int) -> int:
    size = 1
    while size * 2 <= min(n, cap):
        size *= 2
    return size


def dtype_check(node: NodeInfo, allowed: Iterable[DType], indices: Sequence[int] | None = None) -> Support:
    return backend_dtype_check(node, allowed, "opencl", indices)


def float32_only(node: NodeInfo, indices: Sequence[int] | None = None) -> Support:
    return dtype_check(node, (dtypes.float32,), indices)


def static_rank(node: NodeInfo, index: int = 0) -> int | None:
    info = node.inputs[index] if index < len(node.inputs) else None
    return None if info is None else info.rank


class ClDevice(Protocol):
    """What a kernel uses of its backend (``hetero_opencl.backend.OpenCLBackend``), named here so that the kernels
    do not import the backend that imports them."""

    rt: Runtime
    ctx: Any  # the device's _native.Context: launches, reads and writes on its one in-order queue
    dummy: Any  # a small buffer bound where a kernel's optional buffer argument is absent
    max_positions: int | None  # the session's context length, when it set one

    def alloc(self, nbytes: int, kind: str = "arena") -> Any: ...

    def write_host(self, tensor: Tensor, array: np.ndarray) -> None: ...

    def upload(self, array: np.ndarray, kind: str = "arena") -> Tensor: ...

    def scratch(self, slot: str, nbytes: int) -> Any: ...

    def host_value(self, tensor: Tensor) -> np.ndarray: ...


class ClKernel:
    """Base: keeps the node and the backend; ``prepare`` does nothing unless a kernel plans by shape."""

    def __init__(self, node: NodeInfo, backend: ClDevice) -> None:
        self.info = node
        self.node = node.node
        self.be = backend
        self.rt = backend.rt
        self.ctx = backend.ctx
        self._meta: dict[str, tuple[Any, Any]] = {}

    def attr(self, name: str, default=None):
        return self.node.attrs.get(name, default)

    def k(self, program: str, name: str, defines: Sequence[str] = ()) -> Any:
        return self.rt.kernel(program, name, defines)

    def launch(self, kernel: Any, global_size: Sequence[int], local_size: Sequence[int] | None, *args: Any) -> None:
        if local_size:
            global_size = [up(g, loc) for g, loc in zip(global_size, local_size, strict=True)]
        self.ctx.launch(kernel, list(global_size), list(local_size or []), *args)

    def meta(self, slot: str, values: Sequence[int]) -> Any:
        """An int32 device buffer holding ``values`` (index metadata), re-uploaded only when they change."""
        key = tuple(int(v) for v in values)
        cached = self._meta.get(slot)
        if cached is not None and cached[0] == key:
            return cached[1]
        array = np.asarray(key if key else (0,), dtype=np.int32)
        buf = self.ctx.alloc(array.nbytes)
        self.ctx.write(buf, array.view(np.uint8))
        self._meta[slot] = (key, buf)
        return buf

    def host(self, tensor: Tensor | None) -> np.ndarray | None:
        """A small input's values on the host (``Tensor.host_values``: its host copy, else a waiting download)."""
        if self.recording:
            raise _NotBindable("reads an input on the host")  # a value that may change between replayed runs
        return None if tensor is None else tensor.host_values()

    @property
    def recording(self) -> bool:
        """Whether ``bind`` is recording this kernel's launches (then no value is read on the host)."""
        return isinstance(self.ctx, _Recording)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Any:
        """For the replay: ``run`` on these exact tensors as bound native calls (``ctx.launch`` / ``copy`` / ``zero``
        with their arguments converted once), found by running ``run`` against a recording context. None when
        ``run`` does anything else (reads a value on the host, writes from the host, allocates): then the replay
        calls ``run``."""
        real = self.ctx
        recording = self.ctx = _Recording(real)
        try:
            self.device_work(inputs, outputs)
        except _NotBindable:
            return None
        finally:
            self.ctx = real
        return recording.calls

    @staticmethod
    def host_copies(inputs: Sequence[Tensor | None]) -> list[np.ndarray] | None:
        """The inputs' host copies when every input has one (small values uploaded from the host, or computed from
        such values): shape arithmetic then stays on the host instead of a launch and a waiting download."""
        arrays = []
        for t in inputs:
            copy = None if t is None or t.is_host else t.host_copy
            if copy is None:
                return None
            arrays.append(copy.reshape(t.shape))
        return arrays

    def put_host_result(self, out: Tensor, value: np.ndarray) -> None:
        """A small result computed on the host: written to the device (without waiting) and kept as its host copy."""
        if self.recording:
            raise _NotBindable("computes its result on the host")
        self.be.write_host(out, np.asarray(value, dtype=out.dtype.np_dtype).reshape(out.shape))

    def device_work(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        """What ``bind`` records: ``run`` itself, unless a kernel splits host-side checks off its device work."""
        self.run(inputs, outputs)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        pass

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        raise NotImplementedError


class _NotBindable(Exception):
    pass


class _Recording:
    """Stands in for the device context while ``ClKernel.bind`` runs a kernel: device work is kept as bound calls
    (not executed), anything else (host writes and reads, allocation) makes the kernel unbindable."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        self.calls: list[Any] = []

    def launch(self, *args: Any) -> None:
        self.calls.append(functools.partial(self._ctx.launch, *args))

    def copy(self, *args: Any) -> None:
        self.calls.append(functools.partial(self._ctx.copy, *args))

    def zero(self, *args: Any) -> None:
        self.calls.append(functools.partial(self._ctx.zero, *args))

    def __getattr__(self, name: str) -> Any:
        raise _NotBindable(f"calls ctx.{name}")


def fused_activation(attrs: dict) -> tuple[int, float, float]:
    """(code, alpha, beta) of a fused node's ``activation`` attribute; identity without one."""
    params = activation_params(attrs)
    if params is None:
        return 0, 0.0, 0.0
    op_name, alpha, beta = params
    return UNARY[op_name], alpha, beta


def fused_activation_known(node: NodeInfo) -> Support:
    if activation_known(node.node.attrs):
        return SUPPORTED
    return unsupported(f"fused activation {node.attr('activation')}")


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= int(d)
    return strides[::-1]
