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

TARGET_FLAGS = ("--target=hexagon-unknown-linux-musl", "-mv68", "-mhvx", "-mhvx-length=128b")
# -ffp-contract=off: no fused multiply-add, so the scalar float matches a numpy float32 loop bit for bit
COMPILE_FLAGS = ("-O2", "-ffp-contract=off", "-ffreestanding", "-fno-builtin", "-Wall", "-Wextra", "-Werror")
LINK_FLAGS = ("-nostdlib", "-static", "-fuse-ld=lld", "-Wl,-e,_start")
QEMU_CPU = "v67"  # QEMU 7.2's newest Hexagon model; it runs v68 HVX integer code
CLANG_NAMES = ("clang", *(f"clang-{v}" for v in range(19, 13, -1)))
MAGIC = 0x31585648
OP_MATVEC_I8, OP_MATVEC_Q4, OP_RMSNORM, OP_ROPE = 1, 2, 3, 4
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


def _request(op: int, args: list[int], arrays: list[np.ndarray]) -> bytes:
    parts = [struct.pack("<8i", MAGIC, op, *args, *[0] * (6 - len(args)))]
    offset = 32
    for a in arrays:
        pad = -offset % 128
        parts.append(b"\0" * pad)
        data = np.ascontiguousarray(a).tobytes()
        parts.append(data)
        offset += pad + len(data)
    return b"".join(parts)


class QemuHvx:
    """The HVX kernels, each call one run of the test program under qemu-hexagon (inputs already in HVX layouts)."""

    def __init__(self, toolchain: Toolchain | None = None) -> None:
        self.toolchain = toolchain or find_toolchain()
        self.binary = build_runner(self.toolchain)

    def _run(self, op: int, args: list[int], arrays: list[np.ndarray]) -> bytes:
        done = subprocess.run(
            [self.toolchain.qemu, "-cpu", QEMU_CPU, str(self.binary)],
            input=_request(op, args, arrays), capture_output=True, timeout=RUN_TIMEOUT_S,
        )
        if done.returncode != 0:
            raise BackendError(
                f"HVX test program (op {op}, args {args}) exited with {done.returncode} under qemu-hexagon: "
                f"{done.stderr.decode(errors='replace').strip()[-500:] or 'no message'}"
            )
        return done.stdout

    def matvec_i8(self, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        """int32 ``w @ x`` for int8 ``w[rows, cols]``, ``x[cols]``, cols a multiple of 128."""
        rows, cols = w.shape
        out = self._run(OP_MATVEC_I8, [rows, cols], [w.astype(np.int8), x.astype(np.int8)])
        return np.frombuffer(out, np.int32, rows)

    def matvec_q4(
        self, w: np.ndarray, w_scale: np.ndarray, x: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Quantize float ``x`` to int8 blocks, then the q4 product: returns (xq int8, x scales, y float32)."""
        rows = w.shape[0]
        cols = x.shape[0]
        nblocks = cols // 32
        out = self._run(OP_MATVEC_Q4, [rows, cols], [w, w_scale.astype(np.float32), x.astype(np.float32)])
        xq = np.frombuffer(out, np.int8, cols)
        xs = np.frombuffer(out, np.float32, nblocks, cols)
        y = np.frombuffer(out, np.float32, rows, cols + 4 * nblocks)
        return xq, xs, y

    def rmsnorm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        n = x.shape[0]
        eps_bits = int(np.float32(eps).view(np.int32))
        out = self._run(OP_RMSNORM, [n, eps_bits], [x.astype(np.float32), weight.astype(np.float32)])
        return np.frombuffer(out, np.float32, n)

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        dim = x.shape[0]
        out = self._run(OP_ROPE, [dim], [x.astype(np.float32), cos.astype(np.float32), sin.astype(np.float32)])
        return np.frombuffer(out, np.float32, dim)
