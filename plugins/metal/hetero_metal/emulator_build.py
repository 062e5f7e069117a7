"""Builds an emulator library from other ``.metal`` sources than the plugin's own — a kernel under development, or
the deliberately wrong kernels of the tests — with the C++ compiler of this machine, exactly as CMake builds the
plugin's library: the MSL shim and the fiber runtime (``hetero_metal/emu``), ``common.metal``, the source, and the
bindings ``msl_signature`` writes for it."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from hetero.contract import BackendError

from . import msl_signature

PACKAGE = Path(__file__).parent
EMU = PACKAGE / "emu"
MSL = PACKAGE / "msl"
FLAGS = ["-std=c++17", "-O1", "-shared", "-fPIC", "-fvisibility=hidden", "-Wno-attributes"]


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def build_library(sources: Sequence[Path], folder: Path) -> Path:
    """Compile ``sources`` (each a .metal family) into ``folder/libmsl_<hash>.so`` and return its path; an
    unchanged set of sources reuses the library already built there."""
    cxx = compiler()
    if cxx is None:
        raise BackendError("no C++ compiler (c++, g++ or clang++) to build an emulator library")
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    for path in [*sources, *sorted(EMU.iterdir()), MSL / "common.metal"]:
        digest.update(Path(path).read_bytes())
    out = folder / f"libmsl_{digest.hexdigest()[:16]}.so"
    if out.is_file():
        return out
    units = [EMU / "fibers.cpp", EMU / "library.cpp"]
    for source in sources:
        binding = folder / f"bindings_{Path(source).stem}.cpp"
        binding.write_text(msl_signature.bindings(Path(source)), encoding="utf-8")
        units.append(binding)
    includes = [f"-I{p}" for p in dict.fromkeys([EMU, MSL, *(Path(s).parent for s in sources)])]
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    result = subprocess.run([cxx, *FLAGS, *includes, *map(str, units), "-o", str(tmp)], capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise BackendError(f"building an emulator library from {[Path(s).name for s in sources]} failed:\n"
                           f"{result.stderr[-4000:]}")
    tmp.replace(out)
    return out
