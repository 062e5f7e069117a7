"""Reads the kernel signatures and parameter structs of this plugin's ``.metal`` sources.

One reader serves both sides of the plugin: at build time CMake runs this file as a script to write the emulator's
argument bindings (``python msl_signature.py bindings family.metal out.cpp``); at run time the host code packs each
dispatch's arguments by the same signatures (``[[buffer(i)]]`` indices, the byte layout of ``constant`` structs),
whether the dispatch then goes to Metal or to the emulator. Standard library only: it runs before the package is
installed.

The sources follow a small convention that keeps this reader simple: a kernel is ``kernel void name(...)`` with one
parameter per line-free comma-separated item ``type name [[attribute]]``; parameter structs hold 4-byte scalars
(``uint``, ``int``, ``float``) only, so their layout is the same in MSL and in C.
"""

from __future__ import annotations

import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

BUILTINS = (
    "thread_position_in_grid", "threadgroup_position_in_grid", "thread_position_in_threadgroup",
    "thread_index_in_threadgroup", "threads_per_threadgroup", "threadgroups_per_grid", "threads_per_grid",
    "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup", "threads_per_simdgroup",
    "simdgroups_per_threadgroup",
)
_FIELD_CODES = {"uint": "I", "int": "i", "float": "f"}
_KERNEL = re.compile(r"\bkernel\s+void\s+(\w+)\s*\(")
_STRUCT = re.compile(r"\bstruct\s+(\w+)\s*\{([^}]*)\}\s*;", re.S)
_PARAM = re.compile(r"^(?P<type>.+?)\s*\b(?P<name>\w+)\s*\[\[\s*(?P<attr>\w+)\s*(?:\(\s*(?P<index>\d+)\s*\))?\s*\]\]$",
                    re.S)


class SignatureError(ValueError):
    """A .metal source that this reader cannot bind (an unknown attribute, a struct field of another type)."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # as written, e.g. "device const float*", "constant SoftmaxParams&", "uint2"
    attribute: str  # "buffer" or a built-in's name
    index: int = -1  # the buffer index for attribute "buffer"

    @property
    def struct_name(self) -> str | None:
        """The struct a ``constant Struct&`` parameter takes, else None."""
        match = re.fullmatch(r"constant\s+(\w+)\s*&", self.type.strip())
        return match.group(1) if match and match.group(1) not in _FIELD_CODES else None


    @property
    def element(self) -> str | None:
        """The element type a pointer parameter points to ("float" for ``device const float*``), else None."""
        match = re.fullmatch(r"(?:device|constant)\s+(?:const\s+)?(\w+)\s*\*", self.type.strip())
        return match.group(1) if match else None

    @property
    def writable(self) -> bool:
        """A ``device`` pointer without ``const``: the kernel may write through it."""
        return re.fullmatch(r"device\s+\w+\s*\*", self.type.strip()) is not None


@dataclass(frozen=True)
class ParamStruct:
    name: str
    fields: tuple[tuple[str, str], ...]  # (type, name)

    def pack(self, values: dict[str, float | int], where: str) -> bytes:
        missing = [name for _, name in self.fields if name not in values]
        extra = sorted(set(values) - {name for _, name in self.fields})
        if missing or extra:
            raise SignatureError(f"{where}: {self.name} needs fields {missing or 'none missing'}, "
                                 f"unknown {extra or 'none'}")
        return struct.pack(self._codes(), *(_cast(t, values[name]) for t, name in self.fields))

    def size(self) -> int:
        return struct.calcsize(self._codes())

    def _codes(self) -> str:
        return "<" + "".join(_FIELD_CODES[t] for t, _ in self.fields)


def _cast(type_name: str, value: float | int) -> float | int:
    return float(value) if type_name == "float" else int(value)


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Param, ...]

    def buffers(self) -> list[Param]:
        return sorted((p for p in self.params if p.attribute == "buffer"), key=lambda p: p.index)


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", "", source)


def parse(source: str, origin: str = "<metal>") -> tuple[dict[str, Kernel], dict[str, ParamStruct]]:
    """The kernels and parameter structs of one .metal source."""
    text = _strip_comments(source)
    structs: dict[str, ParamStruct] = {}
    for match in _STRUCT.finditer(text):
        fields = []
        for decl in filter(None, (d.strip() for d in match.group(2).split(";"))):
            parts = decl.split()
            if len(parts) != 2 or parts[0] not in _FIELD_CODES:
                raise SignatureError(f"{origin}: struct {match.group(1)} field {decl!r}: parameter structs hold "
                                     f"uint, int or float fields only")
            fields.append((parts[0], parts[1]))
        structs[match.group(1)] = ParamStruct(match.group(1), tuple(fields))
    kernels: dict[str, Kernel] = {}
    for match in _KERNEL.finditer(text):
        params = []
        for item in filter(None, (p.strip() for p in _split_params(_balanced(text, match.end())))):
            p = _PARAM.match(" ".join(item.split()))
            if p is None:
                raise SignatureError(f"{origin}: kernel {match.group(1)}: parameter {item!r} has no [[attribute]]")
            attr = p.group("attr")
            if attr == "buffer":
                params.append(Param(p.group("name"), p.group("type"), attr, int(p.group("index"))))
            elif attr in BUILTINS:
                params.append(Param(p.group("name"), p.group("type"), attr))
            else:
                raise SignatureError(f"{origin}: kernel {match.group(1)}: attribute [[{attr}]] is not bound")
        kernels[match.group(1)] = Kernel(match.group(1), tuple(params))
    return kernels, structs


def _balanced(text: str, start: int) -> str:
    """The text from ``start`` (just after an opening parenthesis) to its closing one."""
    depth = 1
    for i in range(start, len(text)):
        depth += (text[i] == "(") - (text[i] == ")")
        if depth == 0:
            return text[start:i]
    raise SignatureError(f"unbalanced parentheses after {text[max(0, start - 40):start]!r}")


def _split_params(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([<"
        depth -= ch in ")]>"
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def bindings(source_path: Path, common: str = "common.metal") -> str:
    """C++ that binds every kernel of ``source_path`` to the emulator: buffers by index, built-ins by name."""
    kernels, _ = parse(source_path.read_text(encoding="utf-8"), str(source_path))
    lines = [
        f"// Generated from {source_path.name} by msl_signature.py at build time: do not edit.",
        '#include "msl_emu.hpp"',
        f'#include "{common}"',
        f'#include "{source_path.name}"',
        '#include "registry.hpp"',
        "",
        "namespace {",
    ]
    for kernel in kernels.values():
        args = []
        for p in kernel.params:
            if p.attribute == "buffer":
                args.append(f"emu::argument<{p.type}>(inv, {p.index})")
            else:
                args.append(f"emu::builtin<{p.type}>(inv, emu::B_{p.attribute})")
        lines.append(f"void entry_{kernel.name}(const emu::Invocation& inv) {{ {kernel.name}({', '.join(args)}); }}")
    lines.append("const emu::KernelRecord kRecords[] = {")
    lines += [f'    {{"{k}", &entry_{k}}},' for k in kernels]
    lines.append("};")
    lines.append("const emu::Registrar kRegistrar(kRecords, sizeof kRecords / sizeof kRecords[0]);")
    lines.append("}  // namespace")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[1] != "bindings":
        print("usage: msl_signature.py bindings FAMILY.metal OUT.cpp", file=sys.stderr)
        return 2
    Path(argv[3]).write_text(bindings(Path(argv[2])), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
