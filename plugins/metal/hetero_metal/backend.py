"""The Metal backend: kernels looked up by op in a table, dispatches run by a queue.

Tensors are host numpy arrays: Apple GPUs share memory with the CPU, and the host module wraps these arrays as
shared-storage buffers, so tensors cross between ``metal`` and ``cpu`` without copies (memory domain ``host``).
The queue is the emulator's (``HETERO_METAL_EMULATE=1``) or the GPU's; kernels do not know which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from hetero.contract import Device, HostMemory, KernelTableBackend, Tensor

from .kernels import KERNELS
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
            buf = self._scratch[slot] = np.empty(max(int(count), 1), dtype=dtype)
        return buf[:count]

    def download(self, tensor: Tensor) -> np.ndarray:
        self.queue.wait()  # the host reads the array the GPU writes
        return super().download(tensor)

    def synchronize(self) -> None:
        self.queue.wait()

    def close(self) -> None:
        self.queue.wait()
        self._scratch.clear()
