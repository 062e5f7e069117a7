"""The OpenCL backend: device memory (cl_mem buffers, pooled), and kernels looked up by op in a table.

Tensors of this backend hold a ``_native.Buffer`` (one cl_mem, or a sub-buffer of a session's arena); they stay on
the device between ops and between decode steps, and the session copies only at segment edges. Small uploads
(``past_len``, constant indices, shapes) and small integer results computed on the host keep their values as the
tensor's ``host_copy`` (the core's mechanism, see ``hetero.tensor.Tensor``), so kernels and shape inference that need
such a value on the host never wait for the queue.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from hetero.contract import (
    BackendError,
    Device,
    Kernel,
    KernelTableBackend,
    NodeInfo,
    Support,
    Tensor,
    TensorInfo,
    dtypes,
    static_shape,
    unsupported,
)

from .dtype_guard import DtypeGuard
from .kernels import KERNELS
from .runtime import runtime_for

HOST_COPY_BYTES = 4096  # uploads up to this size keep a host copy


class OpenCLBackend(KernelTableBackend):
    name: ClassVar[str] = "opencl"
    # Device memory: the session inserts copies where values cross into or out of it (a session holds one device).
    memory_domain: ClassVar[str] = "opencl"
    kernels = KERNELS  # type: ignore[assignment]  # its kernels take this backend (a ClDevice), not any Backend

    def __init__(self, device: Device, options: dict[str, Any] | None = None) -> None:
        super().__init__(device, options)
        self.rt = runtime_for(device)
        self.ctx = self.rt.ctx
        self.arena_align = max(64, int(self.rt.info.get("base_align_bytes", 128)))  # sub-buffer origins
        self.dummy = self.ctx.alloc(16)  # bound where a kernel's optional buffer argument is absent
        self._scratch: dict[str, Any] = {}
        # The most positions any KV cache of this backend holds (set by the Attention kernels): the rotary table is
        # sized for it once a decode step is replayed.
        self.max_positions: int | None = None

    # -- what runs here ---------------------------------------------------------------------------------------
    def supports(self, node: NodeInfo) -> Support:
        for info in [*node.inputs, *node.outputs]:
            if info is not None and (info.dtype.np_dtype is None or info.dtype.np_dtype.kind in "OSU"):
                return unsupported(f"{info.dtype} tensors do not live in OpenCL buffers")
        return super().supports(node)

    def kernel(self, node: NodeInfo) -> Kernel:
        # Built for the load-time dtypes; rebuilt (or refused) when prepare sees others (untyped If / Scan outputs).
        return DtypeGuard(node, self, super().kernel)

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
        tensor = Tensor(self.alloc(array.nbytes), array.shape, dtypes.from_numpy(array.dtype), self)
        self.write_host(tensor, array)
        return tensor

    def write_host(self, tensor: Tensor, array: np.ndarray) -> None:
        """Write host values into ``tensor``: small ones (token ids, past_len) are kept as its ``host_copy`` and
        written from there without waiting; larger ones are written before this returns."""
        if array.nbytes <= HOST_COPY_BYTES:
            kept = tensor.host_copy
            if kept is not None and kept.shape == array.shape and kept.dtype == array.dtype:
                # in place: launches bound for the replay read this array (the queue drained at the last segment end)
                np.copyto(kept, array)
            else:
                kept = tensor.host_copy = np.array(array, order="C")
            if array.nbytes:
                self.ctx.write(tensor.buffer, kept.reshape(-1).view(np.uint8), blocking=False)
        else:
            tensor.host_copy = None
            if array.nbytes:
                self.ctx.write(tensor.buffer, np.ascontiguousarray(array).reshape(-1).view(np.uint8))

    def write(self, dst: Tensor, src: Tensor) -> None:
        if src.is_host:
            self.write_host(dst, src.numpy())
            return
        if src.dtype.nbytes(src.size):
            self.ctx.copy(src.buffer, dst.buffer, 0, 0, src.dtype.nbytes(src.size))
        kept, value = dst.host_copy, src.host_copy
        if value is not None and kept is not None and kept.shape == value.shape and kept.dtype == value.dtype:
            np.copyto(kept, value)  # in place: launches bound for the replay read this array
        else:
            dst.host_copy = None if value is None else np.array(value, order="C")

    def arena_tensor(self, arena: Any, offset: int, info: TensorInfo) -> Tensor | None:
        """A sub-buffer of the arena (offsets are multiples of the device's base address alignment)."""
        shape = static_shape(info)
        nbytes = info.dtype.nbytes(int(np.prod(shape, dtype=np.int64)))
        return Tensor(self.ctx.sub(arena, offset, nbytes), shape, info.dtype, self)

    def download(self, tensor: Tensor) -> np.ndarray:
        buf = tensor.buffer
        np_dtype = tensor.dtype.np_dtype
        if np_dtype is None:
            raise BackendError(f"opencl: cannot download a {tensor.dtype} tensor")
        if tensor.host_copy is not None:
            return tensor.host_copy.reshape(tensor.shape).copy()
        out = np.empty(tensor.shape, dtype=np_dtype)
        if out.nbytes:
            self.ctx.read(buf, out.reshape(-1).view(np.uint8))
        return out

    def view(self, tensor: Tensor, info: TensorInfo) -> Tensor | None:
        """Reshape-like ops: the same cl_mem under a new shape (buffers are always dense)."""
        shape = static_shape(info)
        view = Tensor(tensor.buffer, shape, info.dtype, self)
        if tensor.host_copy is not None:
            view.host_copy = tensor.host_copy.reshape(shape)
        return view

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
