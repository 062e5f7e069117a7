"""The GPU queue (macOS): compiles each kernel family once per process (common.metal + family source, by Apple's
compiler), then hands the planned dispatches to the host module, which encodes them into a command buffer with
pipelines cached per kernel. ``commit`` queues work; ``wait`` blocks until it completed."""

from __future__ import annotations

from hetero.contract import BackendError

from .plan import Dispatch, source


class MetalQueue:
    def __init__(self, device_index: int = 0) -> None:
        try:
            from . import _metal  # type: ignore[attr-defined]  # built on macOS only
        except ImportError as exc:
            raise BackendError(f"the Metal host module does not import: {exc}") from exc
        self.native = _metal.Queue(device_index)

    def commit(self, dispatches: list[Dispatch]) -> None:
        for family in {d.family for d in dispatches}:
            if not self.native.has_library(family):
                try:
                    self.native.compile(family, source(family))
                except RuntimeError as exc:
                    raise BackendError(str(exc)) from exc
        try:
            self.native.commit([(d.family, d.kernel, d.buffers, d.groups, d.threads) for d in dispatches])
        except RuntimeError as exc:
            raise BackendError(f"metal: {exc}") from exc

    def wait(self) -> None:
        try:
            self.native.wait()
        except RuntimeError as exc:
            raise BackendError(f"metal: {exc}") from exc
