"""Build the HVX kernels with clang's Hexagon target and run them under ``qemu-hexagon`` (Debian: clang, lld,
qemu-user). This is how hetero-hexagon's kernels are tested without a Snapdragon: QEMU executes integer HVX with
128-byte vectors exactly; it does not emulate HVX float, and it says nothing about speed.

The test program (``hvx/qemu_runner.c``) is freestanding: there is no Hexagon C library on a Linux PC, so it brings
its own ``_start`` and makes raw syscalls. One run = one request on stdin, one reply on stdout.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from hetero.contract.errors import BackendError, BackendUnavailable

from .cache import cache_root, content_key
from .hvx_ops import status_error

TARGET_FLAGS = ("--target=hexagon-unknown-linux-musl", "-mv68", "-mhvx", "-mhvx-length=128b")
# -ffp-contract=off: no fused multiply-add, so the scalar float matches a numpy float32 loop bit for bit
COMPILE_FLAGS = ("-O2", "-ffp-contract=off", "-ffreestanding", "-fno-builtin", "-Wall", "-Wextra", "-Werror")
LINK_FLAGS = ("-nostdlib", "-static", "-fuse-ld=lld", "-Wl,-e,_start")
QEMU_CPU = "v67"  # QEMU 7.2's newest Hexagon model; it runs v68 HVX integer code
CLANG_NAMES = ("clang", *(f"clang-{v}" for v in range(19, 13, -1)))
MAGIC = 0x31585648
RUN_TIMEOUT_S = 120


@dataclass(frozen=True)
class Toolchain:
    clang: str
    qemu: str


def find_toolchain() -> Toolchain:
    """The clang, lld and qemu-hexagon to use, or ``BackendUnavailable`` naming each missing one and its package."""
    missing = []
    clang = next((p for p in map(shutil.which, CLANG_NAMES) if p), None)
    if clang is None:
        missing.append("clang (apt install clang)")
    elif not _has_lld(clang):
        missing.append("ld.lld (apt install lld)")
    qemu = shutil.which("qemu-hexagon")
    if qemu is None:
        missing.append("qemu-hexagon (apt install qemu-user)")
    if missing:
        raise BackendUnavailable(
            "HVX kernels cannot be built and run here: missing " + ", ".join(missing),
            hint="apt install clang lld qemu-user",
        )
    assert clang is not None and qemu is not None
    return Toolchain(clang, qemu)


def _has_lld(clang: str) -> bool:
    # Debian's clang-N finds ld.lld in its own /usr/lib/llvm-N/bin when only lld-N is installed
    return shutil.which("ld.lld") is not None or (Path(os.path.realpath(clang)).parent / "ld.lld").exists()


def sources() -> dict[str, bytes]:
    folder = resources.files("hetero_hexagon") / "hvx"
    return {f.name: f.read_bytes() for f in folder.iterdir() if f.name.endswith((".c", ".h"))}


def build_runner(toolchain: Toolchain) -> Path:
    """Compile and link the test program once per source content and flags; later calls reuse the cached binary."""
    srcs = sources()
    flags = (*TARGET_FLAGS, *COMPILE_FLAGS, *LINK_FLAGS)
    key = content_key(*flags, *(name.encode() + b"\0" + text for name, text in sorted(srcs.items())))
    folder = cache_root() / "hvx" / key
    binary = folder / "qemu_runner"
    if binary.exists():
        return binary
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in srcs.items():
        (folder / name).write_bytes(text)
    scratch = folder / f"qemu_runner.{os.getpid()}"
    c_files = sorted(str(folder / name) for name in srcs if name.endswith(".c"))
    done = subprocess.run([toolchain.clang, *flags, *c_files, "-o", str(scratch)], capture_output=True, text=True)
    if done.returncode != 0:
        raise BackendError(f"building the HVX test program with {toolchain.clang} failed:\n{done.stderr.strip()}")
    scratch.replace(binary)  # atomic: a concurrent build never sees a half-written binary
    return binary


def _request(method: int, inputs: list[np.ndarray], output_sizes: list[int]) -> bytes:
    data = [np.ascontiguousarray(a).tobytes() for a in inputs]
    lengths = [len(d) for d in data] + list(output_sizes)
    parts = [struct.pack(f"<4i{len(lengths)}i", MAGIC, method, len(inputs), len(output_sizes), *lengths)]
    offset = len(parts[0])
    for d in data:
        pad = -offset % 128
        parts += [b"\0" * pad, d]
        offset += pad + len(d)
    return b"".join(parts)


class QemuTransport:
    """hetero_hvx calls run one at a time as the test program under qemu-hexagon (``hvx_ops.Transport``)."""

    def __init__(self, toolchain: Toolchain | None = None) -> None:
        self.toolchain = toolchain or find_toolchain()
        self.binary = build_runner(self.toolchain)

    def invoke(self, method: int, inputs: list[np.ndarray], output_sizes: list[int]) -> list[bytes]:
        done = subprocess.run(
            [self.toolchain.qemu, "-cpu", QEMU_CPU, str(self.binary)],
            input=_request(method, inputs, output_sizes), capture_output=True, timeout=RUN_TIMEOUT_S,
        )
        if done.returncode != 0:
            stderr = done.stderr.decode(errors="replace").strip()[-500:]
            where = f"HVX test program under qemu-hexagon (exit {done.returncode}{': ' + stderr if stderr else ''})"
            raise status_error(where, method, done.returncode)
        if len(done.stdout) != sum(output_sizes):
            raise BackendError(f"HVX test program replied {len(done.stdout)} bytes, expected {sum(output_sizes)}")
        outputs, at = [], 0
        for size in output_sizes:
            outputs.append(done.stdout[at : at + size])
            at += size
        return outputs
