"""What a Metal kernel launch is, independently of who runs it: the kernel, its arguments bound by name to the
``[[buffer(i)]]`` indices of its signature (``constant`` structs packed to their byte layout), and the grid.

Kernels of the backend build ``Dispatch`` objects; a queue runs them — ``hetero_metal.emulator`` on the CPU, or the
Metal host module on macOS, which encodes the same buffers, bytes and sizes into a compute command encoder
(``setBuffer`` / ``setBytes`` / ``dispatchThreadgroups``). Everything up to that call is this module.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import numpy as np

from hetero.contract import BackendError

from . import msl_signature

FAMILIES = ("elementwise", "norm", "matmul", "quant", "attention", "gated_delta", "nn", "movement")
MAX_THREADS_PER_GROUP = 1024
SIMD_WIDTH = 32

# The numpy dtype a kernel's pointer parameter takes, by its MSL element type ("uchar" buffers take any array, as
# bytes).
ELEMENT_DTYPES: dict[str, type[np.generic] | None] = {
    "float": np.float32, "half": np.float16, "uint": np.uint32, "int": np.int32, "long": np.int64,
    "ushort": np.uint16, "uchar": None,
}


def source(family: str) -> str:
    """common.metal followed by the family's source: what Apple's compiler builds as one library."""
    folder = resources.files(__package__).joinpath("msl")
    return folder.joinpath("common.metal").read_text(encoding="utf-8") + "\n" + \
        folder.joinpath(f"{family}.metal").read_text(encoding="utf-8")


@functools.cache
def signatures() -> dict[str, tuple[str, msl_signature.Kernel, dict[str, msl_signature.ParamStruct]]]:
    """kernel name -> (family, signature, the family's parameter structs), over every family."""
    table = {}
    for family in FAMILIES:
        text = resources.files(__package__).joinpath("msl").joinpath(f"{family}.metal").read_text(encoding="utf-8")
        kernels, structs = msl_signature.parse(text, f"{family}.metal")
        for name, kernel in kernels.items():
            table[name] = (family, kernel, structs)
    return table


@dataclass
class Dispatch:
    """One compute dispatch: ``groups`` threadgroups of ``threads`` threads; buffers by index (arrays are device
    memory, bytes are ``constant`` data set inline); ``writes``: the indices of the ``device`` (not ``const``)
    pointers, which the kernel may write."""

    family: str
    kernel: str
    buffers: dict[int, np.ndarray | bytes]
    groups: tuple[int, int, int]
    threads: tuple[int, int, int]
    writes: frozenset[int] = frozenset()

    def describe(self) -> str:
        return f"{self.kernel} over {self.groups} groups of {self.threads} threads"


def _signature(kernel: str) -> tuple[str, msl_signature.Kernel, dict[str, msl_signature.ParamStruct]]:
    try:
        return signatures()[kernel]
    except KeyError:
        raise BackendError(f"metal: no kernel {kernel!r} in the .metal sources") from None


class ArgumentBuffer:
    """A kernel's ``constant`` parameter struct held in a small buffer of its own that the host rewrites between
    runs (``write``), instead of bytes set inline: what varies from one decode step to the next (past_len) lives
    here, so a recorded command plan binds the same buffer at every step and only its contents change. Kernels whose
    parameter structs are the same type may share one."""

    def __init__(self, kernel: str, param: str) -> None:
        _, signature, structs = _signature(kernel)
        found = [p.struct_name for p in signature.buffers() if p.name == param and p.struct_name is not None]
        if not found:
            raise BackendError(f"metal: {kernel} has no constant struct parameter {param!r}")
        self.struct = structs[found[0]]
        self.where = f"{kernel}.{param}"
        self.array = np.zeros(self.struct.size(), np.uint8)

    def write(self, values: dict[str, float | int]) -> None:
        try:
            self.array[:] = np.frombuffer(self.struct.pack(values, self.where), np.uint8)
        except msl_signature.SignatureError as exc:
            raise BackendError(f"metal: {exc}") from exc


Argument = np.ndarray | dict[str, float | int] | ArgumentBuffer


def dispatch(kernel: str, args: dict[str, Argument], groups: tuple[int, ...], threads: tuple[int, ...]) -> Dispatch:
    """Bind ``args`` (parameter name -> array, or -> field values of a constant struct, or an ``ArgumentBuffer``
    holding them) to ``kernel``'s buffer indices. Every buffer parameter must be given: a kernel that ignores an
    optional one gets a placeholder."""
    family, signature, structs = _signature(kernel)
    bound: dict[int, np.ndarray | bytes] = {}
    writes = []
    for param in signature.buffers():
        if param.name not in args:
            raise BackendError(f"metal: {kernel} needs argument {param.name!r}")
        value = args[param.name]
        struct_name = param.struct_name
        if struct_name is not None and isinstance(value, ArgumentBuffer):
            if value.struct.name != struct_name:
                raise BackendError(f"metal: {kernel}.{param.name} takes {struct_name}, not {value.struct.name}")
            bound[param.index] = value.array
        elif struct_name is not None:
            if not isinstance(value, dict):
                raise BackendError(f"metal: {kernel}.{param.name} takes the fields of {struct_name} as a dict")
            try:
                bound[param.index] = structs[struct_name].pack(value, f"{kernel}.{param.name}")
            except msl_signature.SignatureError as exc:
                raise BackendError(f"metal: {exc}") from exc
        elif isinstance(value, np.ndarray):
            element = param.element or ""
            if element not in ELEMENT_DTYPES:
                raise BackendError(f"metal: {kernel}.{param.name} has type {param.type!r}, which no array binds to")
            wanted = ELEMENT_DTYPES[element]
            if wanted is not None and value.dtype != wanted:
                raise BackendError(f"metal: {kernel}.{param.name} takes {np.dtype(wanted)} ({element}), "
                                   f"got {value.dtype}")
            bound[param.index] = value if value.nbytes else np.zeros(4, np.uint8)  # Metal rejects empty buffers
            if param.writable:
                writes.append(param.index)
        else:
            raise BackendError(f"metal: {kernel}.{param.name} takes an array, got {type(value).__name__}")
    unknown = set(args) - {p.name for p in signature.buffers()}
    if unknown:
        raise BackendError(f"metal: {kernel} has no parameter(s) {sorted(unknown)}")
    g = tuple(int(v) for v in (*groups, 1, 1, 1)[:3])
    t = tuple(int(v) for v in (*threads, 1, 1, 1)[:3])
    if min(t) < 1 or t[0] * t[1] * t[2] > MAX_THREADS_PER_GROUP or min(g) < 0:
        raise BackendError(f"metal: {kernel} with threadgroups {g} of {t} threads")
    return Dispatch(family, kernel, bound, g, t, frozenset(writes))  # type: ignore[arg-type]  # 3-tuples


def groups_for(n: int, per_group: int) -> int:
    return max(1, -(-int(n) // per_group))
