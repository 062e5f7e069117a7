"""One OpenCL device for the whole process: context and queue, programs built from the .cl sources (cached on disk
per device and driver), and the work-group sizes found by tuning (cached likewise).

Sessions on the same device share its ``Runtime`` (like MNN's Runtime: long-lived caches), so a program is built
once per process, and once per machine thanks to the disk cache. The cache lives in
``$HETERO_CACHE_DIR/opencl`` (default ``~/.cache/hetero/opencl``), one folder per device + driver version; an entry
is keyed by a hash of the source, the build options and the device/driver strings.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from hetero.contract import BackendError, Device

from .native import load_native

_RUNTIMES: dict[tuple[int, int], Runtime] = {}


def runtime_for(device: Device) -> Runtime:
    key = (int(device.properties.get("platform_index", 0)), int(device.properties.get("device_index", 0)))
    rt = _RUNTIMES.get(key)
    if rt is None:
        rt = _RUNTIMES[key] = Runtime(*key)
    return rt


def cache_root() -> Path:
    base = os.environ.get("HETERO_CACHE_DIR")
    if base:
        return Path(base) / "opencl"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hetero" / "opencl"


@dataclass(frozen=True)
class Variants:
    """Which kernel variants a device gets (see cl/common.cl): chosen from what the device reports, never assumed."""

    fp16: bool = False  # native half loads / stores (cl_khr_fp16)
    subgroups: str | None = None  # "intel" (cl_intel_subgroups) or "khr" (cl_khr_subgroups), for reductions
    c_std: str = "CL1.2"  # the OpenCL C version programs are built for

    def defines(self) -> list[str]:
        flags = []
        if self.fp16:
            flags.append("HAS_FP16=1")
        if self.subgroups:
            flags.append("HAS_SUBGROUPS=1")
        if self.subgroups == "intel":
            flags.append("HAS_INTEL_SUBGROUPS=1")
        return flags


def kernel_variants(extensions: str | Iterable[str], opencl_c_version: str = "OpenCL C 1.2",
                    disabled: Iterable[str] = ()) -> Variants:
    """The variants for a device with these extensions and this OpenCL C version ("OpenCL C 1.2 ..."): fp16 where
    cl_khr_fp16 is reported; subgroup reductions where cl_intel_subgroups is reported (its builtins exist in OpenCL
    C 1.2), or cl_khr_subgroups with OpenCL C 2.0 or later (then programs build as CL2.0, where the khr subgroup
    builtins live). ``disabled`` ("fp16", "subgroups") turns variants off (HETERO_OPENCL_DISABLE)."""
    ext = set(extensions.split() if isinstance(extensions, str) else extensions)
    off = set(disabled)
    match = re.search(r"(\d+)\.(\d+)", opencl_c_version)
    c_version = (int(match.group(1)), int(match.group(2))) if match else (1, 2)
    fp16 = "cl_khr_fp16" in ext and "fp16" not in off
    subgroups = None
    c_std = "CL1.2"
    if "subgroups" not in off:
        if "cl_intel_subgroups" in ext:
            subgroups = "intel"
        elif "cl_khr_subgroups" in ext and c_version >= (2, 0):
            subgroups, c_std = "khr", "CL2.0"
    return Variants(fp16, subgroups, c_std)


def _source(name: str) -> str:
    return resources.files(__package__).joinpath("cl").joinpath(name).read_text(encoding="utf-8")


class Runtime:
    """Context, queue and caches of one OpenCL device."""

    def __init__(self, platform: int, device: int) -> None:
        native = load_native()
        try:
            self.ctx = native.Context(platform, device)
        except (RuntimeError, ValueError) as exc:
            raise BackendError(f"cannot open OpenCL device {platform}.{device}: {exc}") from exc
        self.native = native
        self.info: dict[str, Any] = self.ctx.info()
        ext = set(self.info["extensions"].split())
        disabled = [v.strip() for v in os.environ.get("HETERO_OPENCL_DISABLE", "").split(",") if v.strip()]
        self.variants = kernel_variants(ext, self.info.get("opencl_c_version", ""), disabled)
        self.fp16 = self.variants.fp16
        self.subgroups = self.variants.subgroups is not None
        self.max_wg = int(self.info["max_work_group_size"])
        identity = f"{self.info['name']}|{self.info['version']}|{self.info['driver_version']}"
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{self.info['name']}-{self.info['driver_version']}")[:80]
        self.identity = identity
        self.cache_dir = cache_root() / f"{slug}-{hashlib.sha256(identity.encode()).hexdigest()[:8]}"
        self._programs: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._kernels: dict[tuple[str, tuple[str, ...], str], Any] = {}
        self._tuning_path = self.cache_dir / "tuning.json"
        self._tuning: dict[str, int] | None = None
        self.stats = {"built": 0, "loaded": 0}

    # -- programs ----------------------------------------------------------------------------------------------
    def options(self, defines: Sequence[str]) -> str:
        flags = [f"-cl-std={self.variants.c_std}"] + [f"-D{d}" for d in [*defines, *self.variants.defines()]]
        return " ".join(flags)

    def program(self, name: str, defines: Sequence[str] = ()) -> Any:
        key = (name, tuple(defines))
        prog = self._programs.get(key)
        if prog is None:
            prog = self._programs[key] = self._build(name, key[1])
        return prog

    def kernel(self, name: str, kernel: str, defines: Sequence[str] = ()) -> Any:
        key = (name, tuple(defines), kernel)
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = self.program(name, defines).kernel(kernel)
        return k

    def _build(self, name: str, defines: tuple[str, ...]) -> Any:
        source = _source("common.cl") + "\n" + _source(name)
        options = self.options(defines)
        digest = hashlib.sha256(f"{source}\0{options}\0{self.identity}".encode()).hexdigest()[:24]
        path = self.cache_dir / f"{name.removesuffix('.cl')}-{digest}.bin"
        if path.is_file():
            try:
                prog = self.ctx.load(path.read_bytes(), options)
                self.stats["loaded"] += 1
                return prog
            except RuntimeError:
                path.unlink(missing_ok=True)  # stale or corrupt: rebuild below
        try:
            prog = self.ctx.build(source, options)
        except RuntimeError as exc:
            raise BackendError(f"OpenCL build of {name} ({options}) failed on {self.info['name']}: {exc}") from exc
        self.stats["built"] += 1
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(prog.binary())
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache only costs build time
        return prog

    # -- work-group tuning -------------------------------------------------------------------------------------
    def tuned(self, key: str, candidates: Sequence[int], trial: Callable[[int], None], default: int) -> int:
        """The fastest of ``candidates`` for ``key`` (``trial(size)`` enqueues one run), measured once per device
        and driver and cached; HETERO_OPENCL_TUNE=0 skips measuring and uses ``default``."""
        table = self._load_tuning()
        if key in table:
            return table[key]
        candidates = [c for c in candidates if c <= self.max_wg] or [1]
        if os.environ.get("HETERO_OPENCL_TUNE", "1") == "0" or len(candidates) == 1:
            return default if default in candidates else candidates[0]
        best, best_time = candidates[0], float("inf")
        for size in candidates:
            try:
                start = time.perf_counter()
                trial(size)  # warm up (and check the size is accepted)
                self.ctx.finish()
                # Slow trials (big products on a CPU device) are timed once more, fast ones three times.
                repeats = 1 if time.perf_counter() - start > 0.05 else 3
                start = time.perf_counter()
                for _ in range(repeats):
                    trial(size)
                self.ctx.finish()
                elapsed = (time.perf_counter() - start) / repeats
            except (RuntimeError, BackendError):
                continue
            if elapsed < best_time:
                best, best_time = size, elapsed
        table[key] = best
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            self._tuning_path.write_text(json.dumps(table, indent=1, sort_keys=True), encoding="utf-8")
        except OSError:
            pass
        return best

    def is_tuned(self, key: str) -> bool:
        return key in self._load_tuning()

    def _load_tuning(self) -> dict[str, int]:
        if self._tuning is None:
            try:
                self._tuning = {str(k): int(v) for k, v in json.loads(self._tuning_path.read_text()).items()}
            except (OSError, ValueError, AttributeError):
                self._tuning = {}
        return self._tuning
