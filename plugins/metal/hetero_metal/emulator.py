"""The emulator queue: runs ``Dispatch``es and recorded ``CommandPlan``s through a compiled emulator library
(``libhetero_msl_emu.so``, the .metal sources compiled as C++ against src/emu/msl_emu.hpp) over numpy buffers,
and raises ``KernelFault`` when the emulator finds a race in threadgroup memory, a divergent barrier or simdgroup
function, or an index past a threadgroup array. Every dispatch runs its threads in a new seeded order
(``HETERO_METAL_EMULATE_SEED`` fixes the first seed)."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetero.contract import BackendError

from .command_plan import CommandPlan, Item, PlanQueue
from .plan import Dispatch

LIBRARY_NAME = "libhetero_msl_emu.so"
_MAX_BUFFERS = 31


class KernelFault(BackendError):
    """The emulator saw a kernel do something a GPU would not forgive (a race, a divergent barrier...)."""


def library_path() -> Path:
    return Path(__file__).with_name(LIBRARY_NAME)


class EmulatorLibrary:
    """One compiled emulator library: the plugin's own, or one a test built from other .metal sources."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.lib = ctypes.CDLL(str(self.path))
        except OSError as exc:
            raise BackendError(f"metal emulator library {self.path} does not load: {exc}") from exc
        self.lib.hetero_msl_dispatch.restype = ctypes.c_int
        self.lib.hetero_msl_dispatch.argtypes = [
            ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint32),
            ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
        ]
        self.lib.hetero_msl_kernel_name.restype = ctypes.c_char_p
        self.kernels = {self.lib.hetero_msl_kernel_name(i).decode() for i in range(self.lib.hetero_msl_kernel_count())}

    def run(self, d: Dispatch, seed: int, check_races: bool = True) -> None:
        pointers = (ctypes.c_void_p * _MAX_BUFFERS)()
        keep = []
        for index, value in d.buffers.items():
            if isinstance(value, bytes):
                holder = ctypes.create_string_buffer(value, max(len(value), 16))
                keep.append(holder)
                pointers[index] = ctypes.addressof(holder)
            else:
                if not value.flags.c_contiguous:
                    raise BackendError(f"metal: {d.kernel} buffer {index} is not contiguous")
                pointers[index] = value.ctypes.data
        self.run_bound(Launch.of(d.kernel, pointers, d.groups, d.threads), seed, check_races)

    def run_bound(self, launch: Launch, seed: int, check_races: bool = True) -> None:
        """One dispatch whose buffer addresses are resolved already (a recorded plan's command)."""
        error = ctypes.create_string_buffer(1024)
        rc = self.lib.hetero_msl_dispatch(launch.kernel, launch.pointers, launch.groups, launch.threads, seed,
                                          int(check_races), error, len(error))
        if rc != 0:
            raise KernelFault(f"metal emulator: {error.value.decode(errors='replace')}")


@dataclass
class Launch:
    """A dispatch as the library's C call takes it."""

    kernel: bytes
    pointers: Any  # ctypes.c_void_p * _MAX_BUFFERS
    groups: Any  # ctypes.c_uint32 * 3
    threads: Any

    @staticmethod
    def of(kernel: str, pointers: Any, groups: tuple[int, int, int], threads: tuple[int, int, int]) -> Launch:
        return Launch(kernel.encode(), pointers, (ctypes.c_uint32 * 3)(*groups), (ctypes.c_uint32 * 3)(*threads))


class EmulatorQueue(PlanQueue):
    """Runs what a segment submitted at ``wait``, as the GPU queue does: direct dispatches one by one, a recorded
    command plan through the addresses resolved when it was recorded (the plan is the same object the GPU queue
    encodes into an indirect command buffer)."""

    def __init__(self, library: EmulatorLibrary | None = None, seed: int | None = None) -> None:
        super().__init__()
        self.library = library or EmulatorLibrary(library_path())
        env_seed = os.environ.get("HETERO_METAL_EMULATE_SEED")
        self.seed = seed if seed is not None else int(env_seed) if env_seed else int.from_bytes(os.urandom(4), "little")
        self.dispatches = 0
        self._launches: dict[int, list[Launch]] = {}  # id(plan) -> its commands, addresses resolved

    def execute(self, items: list[Item]) -> None:
        for item in items:
            if isinstance(item, CommandPlan):
                for launch in self._launches_of(item):
                    self.library.run_bound(launch, self._next_seed())
            else:
                for d in item:
                    self.library.run(d, self._next_seed())

    def _next_seed(self) -> int:
        self.dispatches += 1
        return self.seed + self.dispatches - 1

    def _launches_of(self, plan: CommandPlan) -> list[Launch]:
        launches = self._launches.get(id(plan))
        if launches is None:
            launches = []
            for command in plan.commands:
                pointers = (ctypes.c_void_p * _MAX_BUFFERS)()
                for index, address in plan.pointers(command).items():
                    pointers[index] = address
                launches.append(Launch.of(command.kernel, pointers, command.groups, command.threads))
            self._launches[id(plan)] = launches
        return launches

    def forget(self, plan: CommandPlan) -> None:
        self._launches.pop(id(plan), None)


def as_buffer(array: np.ndarray) -> np.ndarray:
    """A C-contiguous view or copy of ``array`` (device buffers are dense)."""
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)
