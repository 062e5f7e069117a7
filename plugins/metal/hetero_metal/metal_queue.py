"""The GPU queue (macOS): compiles each kernel family once per process (common.metal + family source, by Apple's
compiler) and collects the dispatches the kernels submit; ``wait`` — the session's ``synchronize()`` at the end of
each segment, or a kernel that must read a value on the host — encodes everything collected into one command buffer
(pipelines cached per kernel), commits it and waits. So a segment is one command buffer, and a replayed decode step
re-issues dispatches planned once (``bind``)."""

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
        self.pending: list[Dispatch] = []

    def commit(self, dispatches: list[Dispatch]) -> None:
        for family in {d.family for d in dispatches}:
            if not self.native.has_library(family):
                try:
                    self.native.compile(family, source(family))
                except RuntimeError as exc:
                    raise BackendError(str(exc)) from exc
        self.pending.extend(dispatches)

    def wait(self) -> None:
        pending, self.pending = self.pending, []
        try:
            if pending:
                self.native.commit([(d.family, d.kernel, d.buffers, d.groups, d.threads) for d in pending])
            self.native.wait()
        except RuntimeError as exc:
            raise BackendError(f"metal: {exc}") from exc
