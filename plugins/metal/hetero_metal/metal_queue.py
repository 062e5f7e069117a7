"""The GPU queue (macOS): compiles each kernel family once per process (common.metal + family source, by Apple's
compiler) and runs what ``PlanQueue`` hands it at ``wait`` — the session's ``synchronize()`` at the end of each
segment, or a kernel that must read a value on the host — as one command buffer: direct dispatches encoded as they
come, and each recorded ``CommandPlan`` encoded once into an indirect command buffer at its first run and replayed
with ``executeCommandsInBuffer`` after (so a replayed decode step encodes nothing again)."""

from __future__ import annotations

from collections.abc import Sequence

from hetero.contract import BackendError

from .command_plan import CommandPlan, Item, PlanQueue
from .plan import Dispatch, source


class MetalQueue(PlanQueue):
    def __init__(self, device_index: int = 0) -> None:
        super().__init__()
        try:
            from . import _metal  # type: ignore[attr-defined]  # built on macOS only
        except ImportError as exc:
            raise BackendError(f"the Metal host module does not import: {exc}") from exc
        self.native = _metal.Queue(device_index)

    def prepare(self, dispatches: Sequence[Dispatch]) -> None:
        for family in {d.family for d in dispatches}:
            if not self.native.has_library(family):
                try:
                    self.native.compile(family, source(family))
                except RuntimeError as exc:
                    raise BackendError(str(exc)) from exc

    def execute(self, items: list[Item]) -> None:
        # The direct dispatches of this command buffer bind one table (each host allocation once, views by offset,
        # constant structs packed into its first buffer): the same resolution as a recorded plan, not kept.
        direct = [d for item in items if not isinstance(item, CommandPlan) for d in item]
        table = CommandPlan([direct])
        work: list[tuple[int, int]] = []  # (0, id of a plan) or (1, index of a direct dispatch in the table)
        done = 0
        try:
            for item in items:
                if isinstance(item, CommandPlan):
                    if not self.native.has_plan(id(item)):
                        self.native.record(id(item), _commands(item), item.buffers, sorted(item.written))
                    work.append((0, id(item)))
                else:
                    work.extend((1, done + i) for i in range(len(item)))
                    done += len(item)
            if work:
                self.native.submit(work, _commands(table), table.buffers, sorted(table.written))
            self.native.wait()
        except RuntimeError as exc:
            raise BackendError(f"metal: {exc}") from exc

    def forget(self, plan: CommandPlan) -> None:
        self.native.forget(id(plan))


def _commands(plan: CommandPlan) -> list[tuple]:
    return [(c.family, c.kernel, list(c.bindings), c.groups, c.threads) for c in plan.commands]
