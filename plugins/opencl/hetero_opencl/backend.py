"""The OpenCL backend: device memory (cl_mem buffers, pooled), and kernels looked up by op in a table.

Tensors of this backend hold a ``_native.Buffer`` (one cl_mem); they stay on the device between ops and between
decode steps, and the session copies only at memory-domain boundaries. Small uploads (``past_len``, constant
indices, shapes) keep a host copy on the buffer (``shadow``) so kernels and shape inference that need such a value on
the host never wait for the queue.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from hetero import dtypes
from hetero.backend import Device, KernelTableBackend, NodeInfo, Support, unsupported
from hetero.errors import BackendError
from hetero.tensor import Tensor, TensorInfo

from .dtype_guard import DtypeGuard
from .kernels import KERNELS
from .kernels.common import ClKernel
from .runtime import runtime_for

SHADOW_BYTES = 4096  # uploads up to this size keep a host copy


class OpenCLBackend(KernelTableBackend):
    name: ClassVar[str] = "opencl"
    kernels = KERNELS

    def __init__(self, device: Device, options: dict[str, Any] | None = None) -> None:
        super().__init__(device, options)
        self.rt = runtime_for(device)
        self.ctx = self.rt.ctx
        platform = int(device.properties.get("platform_index", 0))
        index = int(device.properties.get("device_index", 0))
        # One memory domain per device: the session inserts copies where values cross into or out of it.
        self.memory_domain = f"opencl:{platform}.{index}"  # type: ignore[misc]
        self.dummy = self.ctx.alloc(16)  # bound where a kernel's optional buffer argument is absent
        self._scratch: dict[str, Any] = {}

    # -- what runs here ---------------------------------------------------------------------------------------
    def supports(self, node: NodeInfo) -> Support:
        for info in [*node.inputs, *node.outputs]:
            if info is not None and (info.dtype.np_dtype is None or info.dtype.np_dtype.kind in "OSU"):
                return unsupported(f"{info.dtype} tensors do not live in OpenCL buffers")
        return super().supports(node)

    def kernel(self, node: NodeInfo):
        return DtypeGuard(node, self, self._make_kernel)

    def _make_kernel(self, node: NodeInfo):
        factory = self._table()[(node.domain, node.op_type)]
        if isinstance(factory, type) and issubclass(factory, ClKernel):
            return factory(node, self)
        return factory(node)

    # -- memory -----------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int, kind: str = "arena") -> Any:
        try:
            return self.ctx.alloc(int(nbytes))
        except RuntimeError as exc:
            raise BackendError(f"opencl: cannot allocate {nbytes} bytes on {self.device.name}: {exc}") from exc

    def upload(self, array: np.ndarray, kind: str = "arena") -> Tensor:
        array = np.asarray(array)
        if not array.flags.c_contiguous:
            array = array.copy(order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
        if array.dtype.kind in "OSU":
            raise BackendError(f"opencl: {array.dtype} arrays cannot be uploaded")
        buf = self.alloc(array.nbytes)
        if array.nbytes <= SHADOW_BYTES:
            # Small values (token ids, past_len): keep a host copy and queue the write from it without waiting.
            buf.shadow = array.copy()
            if array.nbytes:
                self.ctx.write(buf, buf.shadow.reshape(-1).view(np.uint8), blocking=False)
        elif array.nbytes:
            self.ctx.write(buf, array.reshape(-1).view(np.uint8))
        return Tensor(buf, array.shape, dtypes.from_numpy(array.dtype), self)

    def download(self, tensor: Tensor) -> np.ndarray:
        buf = tensor.buffer
        np_dtype = tensor.dtype.np_dtype
        if np_dtype is None:
            raise BackendError(f"opencl: cannot download a {tensor.dtype} tensor")
        if buf.shadow is not None:
            return buf.shadow.reshape(tensor.shape).copy()
        out = np.empty(tensor.shape, dtype=np_dtype)
        if out.nbytes:
            self.ctx.read(buf, out.reshape(-1).view(np.uint8))
        return out

    def view(self, tensor: Tensor, info: TensorInfo) -> Tensor | None:
        """Reshape-like ops: the same cl_mem under a new shape (buffers are always dense)."""
        return Tensor(tensor.buffer, info.shape, info.dtype, self)  # type: ignore[arg-type]

    def host_value(self, tensor: Tensor) -> np.ndarray:
        """A small input's values on the host: its shadow when it was uploaded, else a (waiting) download."""
        buf = tensor.buffer
        if tensor.is_host:
            return np.asarray(buf)
        if buf.shadow is not None:
            return buf.shadow.reshape(tensor.shape)
        return self.download(tensor)

    def scratch(self, slot: str, nbytes: int) -> Any:
        """A grow-only buffer shared by the kernels of this backend (safe: one in-order queue)."""
        buf = self._scratch.get(slot)
        if buf is None or buf.nbytes < nbytes:
            buf = self._scratch[slot] = self.alloc(max(int(nbytes), 16))
        return buf

    def synchronize(self) -> None:
        self.ctx.finish()

    def close(self) -> None:
        # The device's Runtime (context, programs) is shared by every session on it and lives for the process.
        self.ctx.finish()
        self._scratch.clear()
