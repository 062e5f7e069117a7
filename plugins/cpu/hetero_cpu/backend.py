"""The CPU backend: native kernels (hetero_cpu._native) on host memory, looked up by op in a table."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from hetero.contract import SUPPORTED, Device, HeteroError, HostMemory, Kernel, KernelTableBackend, NodeInfo, Support

from . import _native, fuse
from .kernels import KERNELS
from .kernels.half import HalfUpcast, float32_form
from .kernels.numpy_ops import CpuNumpyKernel


class CpuBackend(HostMemory, KernelTableBackend):
    name: ClassVar[str] = "cpu"
    kernels = KERNELS
    option_keys: ClassVar[tuple[str, ...]] = ("threads", "isa", "precision")
    precisions: ClassVar[tuple[str, ...]] = ("high", "normal")
    arena_slices = True  # Concat inputs written in their slices of its output, Split outputs views of its input
    float16_via_float32 = True  # kernels/half.py: float16 nodes run their float32 kernels between casts

    def __init__(self, device: Device, options: dict[str, Any] | None = None) -> None:
        super().__init__(device, options)
        threads = self.options.get("threads")
        if threads is not None:
            if int(threads) < 1:
                raise HeteroError(f"cpu backend: threads={threads}; expected a positive number")
            # The pool is per process: the last session to set it wins, like OMP_NUM_THREADS.
            _native.set_num_threads(int(threads))
        precision = self.options.get("precision")
        if precision is not None and precision not in self.precisions:
            raise HeteroError(f"cpu backend: precision={precision!r}; expected one of {self.precisions} (\"high\": "
                              "fp32 GEMMs; \"normal\": bf16x3 on CPUs with AMX-BF16, docs/onnx-models.md)")
        isa = self.options.get("isa")
        if isa is not None:
            _native.set_isa(str(isa))

    def supports(self, node: NodeInfo) -> Support:
        verdict = super().supports(node)
        if verdict or node.domain != "":
            return verdict
        # A float16 node the float32 kernel computes (half.py), else a native kernel declined this configuration (a
        # dtype, an attribute): numpy runs it inside the plugin.
        as_float32 = float32_form(node)
        if as_float32 is not None and super().supports(as_float32):
            return SUPPORTED
        return CpuNumpyKernel.accepts(node)

    def kernel(self, node: NodeInfo) -> Kernel:
        if super().supports(node):
            return super().kernel(node)
        as_float32 = float32_form(node)
        if as_float32 is not None and super().supports(as_float32):
            return HalfUpcast(node, super().kernel(as_float32))
        return CpuNumpyKernel(node, self)

    def fuse_calls(self, program: Sequence[Callable[[], Any]]) -> list[Callable[[], Any]]:
        """The replay's bound calls with the decode step's matmul patterns fused, then runs of calls native code
        takes whole merged into one call each (``hetero_cpu.fuse``); ``HETERO_CPU_FUSE=0`` turns both off,
        ``HETERO_CPU_STEP=0`` the merge alone (to measure the difference)."""
        if os.environ.get("HETERO_CPU_FUSE", "1") == "0":
            return list(program)
        fused = fuse.fuse_calls(program)
        if os.environ.get("HETERO_CPU_STEP", "1") == "0":
            return fused
        return fuse.step_calls(fused)

    def after_replay(self) -> None:
        """After each replayed run: the pool's idle workers keep spinning into the next run, sleeping ones are woken
        to (waking one costs more than the 50 us it spins otherwise; HETERO_POOL_LINGER_US, threadpool_stats.hpp)."""
        _native.pool_linger()
