"""Finds the CPU (the native module and its instruction set) and creates CPU backends."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from hetero.contract import BackendUnavailable, Device, Factory


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class CpuFactory(Factory):
    name: ClassVar[str] = "cpu"
    priority: ClassVar[int] = 50

    def probe(self) -> list[Device]:
        try:
            from . import _native
        except ImportError as exc:
            raise BackendUnavailable(
                f"the native module hetero_cpu._native does not import: {exc}",
                hint="reinstall the plugin from a checkout: pip install --force-reinstall ./plugins/cpu",
            ) from exc
        return [
            Device(
                "cpu",
                kind="cpu",
                vendor=_cpu_name(),
                memory_bytes=_memory_bytes(),
                properties={"isa": _native.isa(), "isas": list(_native.available_isas()),
                            "threads": _native.num_threads()},
            )
        ]

    def create(self, device: Device, options: dict[str, Any] | None = None):
        from .backend import CpuBackend

        return CpuBackend(device, options)
