"""The Metal backend: kernels looked up by op in a table, dispatches run by a queue.

Tensors are host numpy arrays: Apple GPUs share memory with the CPU, and the host module wraps these arrays as
shared-storage buffers, so tensors cross between ``metal`` and ``cpu`` without copies (memory domain ``host``).
What the backend allocates (arenas, tensors, the kernels' caches and scratch: ``device_array``) lies in whole pages
of its own, which Metal wraps without a copy (``newBufferWithBytesNoCopy`` needs page-aligned memory); anything
else a kernel reads (weights mapped from a file, a cpu tensor) is staged. The queue is the emulator's
(``HETERO_METAL_EMULATE=1``) or the GPU's; kernels do not know which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from hetero.contract import BackendError, Device, HostMemory, KernelTableBackend, Tensor, TensorInfo, static_shape

from .kernels import KERNELS
from .memory import device_array, page_aligned
from .plan import Dispatch


class MetalBackend(HostMemory, KernelTableBackend):
    name: ClassVar[str] = "metal"
    kernels = KERNELS  # type: ignore[assignment]  # its kernels take this backend (a queue), not any Backend

    def __init__(self, device: Device, options: dict[str, Any] | None = None) -> None:
        super().__init__(device, options)
        if device.properties.get("emulated"):
            from .emulator import EmulatorQueue

            seed = (options or {}).get("seed")
            self.queue: Any = EmulatorQueue(seed=None if seed is None else int(seed))
        else:
            from .metal_queue import MetalQueue

            self.queue = MetalQueue(int(device.properties.get("index", 0)))
        self._scratch: dict[str, np.ndarray] = {}

    def submit(self, dispatches: Sequence[Dispatch], bound: bool = False) -> None:
        """Queue a kernel's dispatches; ``bound``: the same ones at every replayed step (recorded into a plan)."""
        if dispatches:
            self.queue.commit(dispatches, bound)

    def scratch(self, slot: str, count: int, dtype: Any) -> np.ndarray:
        """A grow-only buffer shared by the kernels of this backend (safe: one in-order queue)."""
        buf = self._scratch.get(slot)
        if buf is None or buf.dtype != np.dtype(dtype) or buf.size < count:
            self.queue.wait()  # the previous buffer may still be read by queued work
            buf = self._scratch[slot] = device_array(max(int(count), 1), dtype)
        return buf[:count]

    def alloc(self, nbytes: int, kind: str = "arena") -> np.ndarray:
        return page_aligned(nbytes)

    def empty(self, info: TensorInfo) -> Tensor:
        if info.dtype.np_dtype is None:
            return super().empty(info)  # the error for a layout host memory does not know
        shape = static_shape(info)
        try:
            array = device_array(shape, info.dtype.np_dtype)
        except (OSError, MemoryError, ValueError) as exc:
            raise BackendError(f"cannot allocate a {info} tensor for metal: {exc}") from exc
        return Tensor(array, shape, info.dtype, self)

    def download(self, tensor: Tensor) -> np.ndarray:
        self.queue.wait()  # the host reads the array the GPU writes
        return super().download(tensor)

    def synchronize(self) -> None:
        self.queue.wait()

    def close(self) -> None:
        self.queue.wait()
        self._scratch.clear()
