"""Command plans: a segment's dispatches encoded once and replayed at every decode step.

The kernels submit their dispatches to the backend's queue; the queue collects them until ``wait`` (the end of a
segment). A kernel bound for the session's replay submits the same ``Dispatch`` objects at every step (its
per-step values — past_len — live in ``ArgumentBuffer``s, which it rewrites before submitting), so a run of such
submissions is recorded once as a ``CommandPlan``: every buffer binding resolved to (plan buffer, byte offset),
every inline constant struct packed into one constants buffer, the grid and threadgroup sizes fixed. At later
steps the queue finds the plan by the identity of the submissions and replays it: nothing is planned or encoded
again, only the argument buffers' contents have changed.

``PlanQueue`` is that logic, shared by both executors: ``EmulatorQueue`` runs a plan's commands through the
emulator library; ``MetalQueue`` encodes it once into an ``MTLIndirectCommandBuffer`` and replays it with
``executeCommandsInBuffer``. The counters (``recorded``, ``replayed``) let tests check that a plan is recorded once
and replayed after.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetero.contract import BackendError

from .plan import Dispatch

# Metal's alignment for a buffer offset bound to a ``constant`` parameter (macOS: 256 bytes; iOS needs less).
CONSTANT_ALIGNMENT = 256
MAX_PLANS = 64  # recorded plans kept per queue (one per replayed segment and input signature)
MAX_COMMANDS = 16384  # Metal's limit on one executeCommandsInBuffer range


@dataclass(frozen=True)
class Command:
    """One recorded dispatch: ``bindings`` are (the kernel's buffer index, the plan's buffer, byte offset)."""

    family: str
    kernel: str
    bindings: tuple[tuple[int, int, int], ...]
    groups: tuple[int, int, int]
    threads: tuple[int, int, int]


def _root(array: np.ndarray) -> tuple[np.ndarray, int]:
    """The array ``array``'s memory belongs to, and its byte offset there: views of one arena bind one buffer."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root is array or not root.flags.c_contiguous:
        return array, 0
    offset = array.ctypes.data - root.ctypes.data
    if offset < 0 or offset + array.nbytes > root.nbytes:
        return array, 0
    return root, offset


class CommandPlan:
    """Dispatches recorded for replay. ``buffers[0]`` is the constants buffer (the inline structs, each at a
    256-byte aligned offset); the others are the distinct arrays the dispatches bind, each once, with the byte
    offset of every view into it. ``submissions`` keeps the submitted lists alive (the queue finds the plan by
    their identity)."""

    def __init__(self, submissions: Sequence[Sequence[Dispatch]]) -> None:
        self.submissions = tuple(submissions)
        constants = bytearray()
        self.buffers: list[np.ndarray] = [np.zeros(0, np.uint8)]
        index_of: dict[int, int] = {}
        self.written: set[int] = set()  # buffers some command writes (the GPU queue copies staged ones back)
        commands = []
        for d in (d for submitted in self.submissions for d in submitted):
            bindings = []
            for index, value in sorted(d.buffers.items()):
                if isinstance(value, bytes):
                    constants += bytes(-len(constants) % CONSTANT_ALIGNMENT)
                    bindings.append((index, 0, len(constants)))
                    constants += value
                    continue
                if not value.flags.c_contiguous:
                    raise BackendError(f"metal: {d.kernel} buffer {index} is not contiguous")
                root, offset = _root(value)
                slot = index_of.get(id(root))
                if slot is None:
                    slot = index_of[id(root)] = len(self.buffers)
                    self.buffers.append(root)
                bindings.append((index, slot, offset))
                if index in d.writes:
                    self.written.add(slot)
            commands.append(Command(d.family, d.kernel, tuple(bindings), d.groups, d.threads))
        if len(commands) > MAX_COMMANDS:
            raise BackendError(f"metal: a command plan of {len(commands)} dispatches (at most {MAX_COMMANDS})")
        self.buffers[0] = np.frombuffer(bytes(constants) or bytes(4), np.uint8).copy()
        self.commands: tuple[Command, ...] = tuple(commands)

    def pointers(self, command: Command) -> dict[int, int]:
        """The address each of ``command``'s buffer indices binds (for the emulator)."""
        return {index: self.buffers[slot].ctypes.data + offset for index, slot, offset in command.bindings}


Item = CommandPlan | list[Dispatch]


class PlanQueue:
    """Collects submissions until ``wait``; then runs of bound submissions replay their recorded plan (recorded at
    their first sight) and the others run as direct dispatches, in submission order. Subclasses execute."""

    def __init__(self) -> None:
        self.pending: list[tuple[Sequence[Dispatch], bool]] = []
        self.plans: dict[tuple[int, ...], CommandPlan] = {}
        self.recorded = 0
        self.replayed = 0
        self._pending_writes: list[tuple[int, int]] = []

    def commit(self, dispatches: Sequence[Dispatch], bound: bool = False) -> None:
        """Queue ``dispatches``; ``bound``: the same list is submitted again at every step of a replay."""
        self.prepare(dispatches)
        self.pending.append((dispatches, bound))
        for d in dispatches:
            for index in d.writes:
                array = d.buffers[index]
                if isinstance(array, np.ndarray):
                    self._pending_writes.append((array.ctypes.data, array.ctypes.data + array.nbytes))

    def run(self, dispatches: Sequence[Dispatch]) -> None:
        """Commit and wait: ``dispatches`` have run when this returns."""
        self.commit(dispatches)
        self.wait()

    def writes_pending(self, array: np.ndarray) -> bool:
        """Whether a queued dispatch may write ``array``'s memory (the host must wait before reading it)."""
        lo, hi = array.ctypes.data, array.ctypes.data + array.nbytes
        return any(a < hi and lo < b for a, b in self._pending_writes)

    def wait(self) -> None:
        pending, self.pending = self.pending, []
        self._pending_writes.clear()
        items: list[Item] = []
        run: list[Sequence[Dispatch]] = []
        for dispatches, bound in pending:
            if bound:
                run.append(dispatches)
                continue
            if run:
                items.append(self._plan_for(run))
                run = []
            if dispatches:
                items.append(list(dispatches))
        if run:
            items.append(self._plan_for(run))
        self.execute(items)

    def _plan_for(self, run: list[Sequence[Dispatch]]) -> CommandPlan:
        key = tuple(id(submitted) for submitted in run)
        plan = self.plans.get(key)
        if plan is not None:
            self.replayed += 1
            return plan
        plan = CommandPlan(run)
        if len(self.plans) >= MAX_PLANS:
            oldest = next(iter(self.plans))
            self.forget(self.plans.pop(oldest))
        self.plans[key] = plan
        self.recorded += 1
        return plan

    # What an executor provides.

    def prepare(self, dispatches: Sequence[Dispatch]) -> None:
        """Called at each commit (the GPU queue compiles the families the dispatches use)."""

    def execute(self, items: list[Item]) -> None:
        raise NotImplementedError

    def forget(self, plan: CommandPlan) -> None:
        """A plan dropped from the cache (the GPU queue releases its indirect command buffer)."""
