"""A real Hexagon cDSP through FastRPC: the host side of the hetero_hvx interface, over ``libcdsprpc.so``.

Written against the API the Hexagon SDK documents (``remote.h``, ``rpcmem.h``): ``remote_handle_control`` with
``DSPRPC_GET_DSP_INFO`` for the DSP's capabilities, ``remote_session_control`` with ``DSPRPC_CONTROL_UNSIGNED_MODULE``
so that an unsigned skel may load, ``remote_handle64_open`` on the URI ``file:///<skel>?<symbol>&_dom=cdsp``,
``remote_handle64_invoke`` with a scalars word and a ``remote_arg`` array (input buffers first), and ``rpcmem_alloc``
for buffers the DSP maps without a copy. The DSP side is ``hvx/skel.c``, built by ``build_skel`` into
``libhetero_hvx_skel.so``, which must sit where the DSP loader looks (``ADSP_LIBRARY_PATH``).

On a machine without ``libcdsprpc.so`` (any PC) ``open_library`` raises ``BackendUnavailable`` with the reason;
nothing here has run on a device yet (see docs/npu.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetero.contract.errors import BackendError, BackendUnavailable

from .hvx_ops import status_error
from .hvx_qemu import COMPILE_FLAGS, Toolchain, sources

LIBRARY_NAMES = ("libcdsprpc.so", "libcdsprpc.so.1")
LIBRARY_ENV = "HETERO_HEXAGON_CDSPRPC"  # a full path to libcdsprpc.so, where it is not on the loader's path
CDSP_DOMAIN_ID = 3
SKEL_NAME = "libhetero_hvx_skel.so"
SKEL_SYMBOL = "hetero_hvx_skel_handle_invoke"
# remote.h request ids and attributes
DSPRPC_GET_DSP_INFO = 2
DSPRPC_CONTROL_UNSIGNED_MODULE = 2
DOMAIN_SUPPORT, HVX_SUPPORT_128B, ARCH_VER = 0, 3, 6
# rpcmem.h: the system heap, cached
RPCMEM_HEAP_ID_SYSTEM = 25
RPCMEM_DEFAULT_FLAGS = 1
# the skel is built for the generic Hexagon ELF target (what the DSP loader takes), small data off (-G0)
SKEL_FLAGS = ("--target=hexagon", "-mv68", "-mhvx", "-mhvx-length=128b", "-G0", "-fPIC", "-shared", "-nostdlib",
              "-fuse-ld=lld")


class _RemoteBuf(ctypes.Structure):
    _fields_ = [("pv", ctypes.c_void_p), ("nLen", ctypes.c_size_t)]


class _RemoteArg(ctypes.Union):
    _fields_ = [("buf", _RemoteBuf), ("h", ctypes.c_uint32), ("h64", ctypes.c_uint64)]


class _Capability(ctypes.Structure):
    _fields_ = [("domain", ctypes.c_uint32), ("attribute_ID", ctypes.c_uint32), ("capability", ctypes.c_uint32)]


class _UnsignedModule(ctypes.Structure):
    _fields_ = [("domain", ctypes.c_int), ("enable", ctypes.c_int)]


def _declare(lib: ctypes.CDLL) -> None:
    """The C signatures (remote.h, rpcmem.h), so that ctypes passes 64-bit handles and pointers intact."""
    u32, u64, ptr = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
    lib.remote_handle_control.argtypes = [u32, ptr, u32]
    lib.remote_session_control.argtypes = [u32, ptr, u32]
    lib.remote_handle64_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(u64)]
    lib.remote_handle64_invoke.argtypes = [u64, u32, ctypes.POINTER(_RemoteArg)]
    lib.remote_handle64_close.argtypes = [u64]
    lib.rpcmem_alloc.restype = ptr
    lib.rpcmem_alloc.argtypes = [ctypes.c_int, u32, ctypes.c_int]
    lib.rpcmem_free.argtypes = [ptr]
    for name in ("remote_handle_control", "remote_session_control", "remote_handle64_open",
                 "remote_handle64_invoke", "remote_handle64_close"):
        getattr(lib, name).restype = ctypes.c_int


def scalars(method: int, n_in: int, n_out: int) -> int:
    """remote.h's REMOTE_SCALARS_MAKE."""
    return ((method & 0x1F) << 24) | ((n_in & 0xFF) << 16) | ((n_out & 0xFF) << 8)


def open_library() -> ctypes.CDLL:
    """libcdsprpc.so, or ``BackendUnavailable`` saying it is absent and what provides it."""
    candidates = [os.environ[LIBRARY_ENV]] if os.environ.get(LIBRARY_ENV) else list(LIBRARY_NAMES)
    found = ctypes.util.find_library("cdsprpc")
    if found and found not in candidates:
        candidates.append(found)
    errors = []
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise BackendUnavailable(
        "no FastRPC: libcdsprpc.so not found (" + "; ".join(errors) + ")",
        hint="on a Snapdragon device it ships with the vendor image (/vendor/lib64); elsewhere the HVX kernels run "
        f"under qemu-hexagon only. Set {LIBRARY_ENV} to its path if it is installed elsewhere",
    )


@dataclass(frozen=True)
class DspInfo:
    arch: int
    hvx_128b_units: int


def dsp_info(lib: ctypes.CDLL) -> DspInfo:
    """The cDSP's architecture version and HVX units, or ``BackendUnavailable`` when the driver has no cDSP."""
    _declare(lib)

    def query(attribute: int) -> int:
        cap = _Capability(CDSP_DOMAIN_ID, attribute, 0)
        status = lib.remote_handle_control(DSPRPC_GET_DSP_INFO, ctypes.byref(cap), ctypes.sizeof(cap))
        if status != 0:
            raise BackendUnavailable(f"FastRPC: remote_handle_control(DSPRPC_GET_DSP_INFO) failed with {status:#x}")
        return int(cap.capability)

    if not query(DOMAIN_SUPPORT):
        raise BackendUnavailable("FastRPC: this device has no cDSP domain")
    return DspInfo(arch=query(ARCH_VER), hvx_128b_units=query(HVX_SUPPORT_128B))


class RpcBuffer:
    """A buffer from rpcmem_alloc (ION / DMA-BUF memory the DSP maps without a copy), viewed as numpy bytes."""

    def __init__(self, lib: ctypes.CDLL, nbytes: int) -> None:
        self._lib = lib
        self.nbytes = nbytes
        self.pointer = lib.rpcmem_alloc(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, max(nbytes, 1))
        if not self.pointer:
            raise BackendError(f"rpcmem_alloc of {nbytes} bytes failed")
        self.array = np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(self.pointer))[:nbytes]

    def __del__(self) -> None:
        if getattr(self, "pointer", None):
            self._lib.rpcmem_free(ctypes.c_void_p(self.pointer))
            self.pointer = None


class FastRpcTransport:
    """hetero_hvx calls on the cDSP (``hvx_ops.Transport``): one handle on the skel, buffers through rpcmem."""

    def __init__(self, skel_dir: Path | None = None) -> None:
        lib = self._lib = open_library()
        _declare(lib)
        self.info = dsp_info(lib)
        if skel_dir is not None:  # the DSP loader searches ADSP_LIBRARY_PATH, read when the session starts
            os.environ["ADSP_LIBRARY_PATH"] = f"{skel_dir};{os.environ.get('ADSP_LIBRARY_PATH', '')}"
        unsigned = _UnsignedModule(CDSP_DOMAIN_ID, 1)
        lib.remote_session_control(DSPRPC_CONTROL_UNSIGNED_MODULE, ctypes.byref(unsigned), ctypes.sizeof(unsigned))
        self.handle = ctypes.c_uint64(0)
        uri = f"file:///{SKEL_NAME}?{SKEL_SYMBOL}&_modver=1.0&_dom=cdsp".encode()
        status = lib.remote_handle64_open(uri, ctypes.byref(self.handle))
        if status != 0:
            raise BackendUnavailable(
                f"FastRPC: remote_handle64_open({uri.decode()}) failed with {status:#x}",
                hint=f"put {SKEL_NAME} (hetero_hexagon.fastrpc.build_skel) in a folder on ADSP_LIBRARY_PATH",
            )

    def invoke(self, method: int, inputs: list[np.ndarray], output_sizes: list[int]) -> list[bytes]:
        buffers = []
        for a in inputs:
            raw = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
            buf = RpcBuffer(self._lib, raw.nbytes)
            buf.array[:] = raw
            buffers.append(buf)
        buffers += [RpcBuffer(self._lib, n) for n in output_sizes]
        args = (_RemoteArg * len(buffers))()
        for arg, buf in zip(args, buffers, strict=True):
            arg.buf.pv, arg.buf.nLen = buf.pointer, buf.nbytes
        status = self._lib.remote_handle64_invoke(self.handle, scalars(method, len(inputs), len(output_sizes)), args)
        if status != 0:
            raise status_error("cDSP", method, status)
        return [buf.array.tobytes() for buf in buffers[len(inputs):]]

    def close(self) -> None:
        if self.handle.value:
            self._lib.remote_handle64_close(self.handle)
            self.handle = ctypes.c_uint64(0)


def build_skel(toolchain: Toolchain, out_dir: Path) -> Path:
    """Build ``libhetero_hvx_skel.so`` (the kernels and skel.c) with clang's Hexagon target into ``out_dir``."""
    srcs = sources()
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in srcs.items():
        (out_dir / name).write_bytes(text)
    c_files = sorted(str(out_dir / n) for n in srcs if n.endswith(".c") and n != "qemu_runner.c")
    target = out_dir / SKEL_NAME
    done = subprocess.run([toolchain.clang, *SKEL_FLAGS, *COMPILE_FLAGS, *c_files, "-o", str(target)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise BackendError(f"building {SKEL_NAME} failed:\n{done.stderr.strip()}")
    return target
