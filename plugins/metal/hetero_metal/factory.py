"""Finds the Metal device (macOS), or the emulator when ``HETERO_METAL_EMULATE=1`` asks for it.

Off macOS, without the emulator, the backend is ``unavailable: Metal needs macOS`` — a status, not an error.
"""

from __future__ import annotations

import os
import sys
from typing import Any, ClassVar

from hetero.contract import Backend, BackendError, BackendUnavailable, Device, Factory

EMULATE_VARIABLE = "HETERO_METAL_EMULATE"
EMULATE_HINT = (f"on Linux, {EMULATE_VARIABLE}=1 runs the Metal kernels in hetero-metal's CPU emulator of Metal's "
                "compute model (slow: for testing kernels, not for speed)")


def emulation_requested() -> bool:
    return os.environ.get(EMULATE_VARIABLE, "") not in ("", "0")


def emulator_device() -> Device:
    from .emulator import EmulatorLibrary, library_path

    path = library_path()
    if not path.is_file():
        raise BackendUnavailable(f"the Metal emulator library {path.name} is not built",
                                 hint="reinstall the plugin from a checkout: pip install --force-reinstall "
                                      "./plugins/metal")
    try:
        kernels = len(EmulatorLibrary(path).kernels)
    except BackendError as exc:
        raise BackendUnavailable(str(exc), hint="pip install --force-reinstall ./plugins/metal") from exc
    return Device("metal-emulator", kind="cpu", vendor="hetero-metal",
                  properties={"emulated": True, "kernels": kernels, "simd_width": 32})


def metal_devices() -> list[Device]:
    if sys.platform != "darwin":
        raise BackendUnavailable("Metal needs macOS", hint=EMULATE_HINT)
    try:
        from . import _metal  # type: ignore[attr-defined]  # built on macOS only
    except ImportError as exc:
        raise BackendUnavailable(f"the Metal host module hetero_metal._metal does not import: {exc}",
                                 hint="pip install --force-reinstall ./plugins/metal (on macOS, with Xcode's "
                                      "command line tools)") from exc
    names = _metal.devices()
    if not names:
        raise BackendUnavailable("no Metal device", hint="a Mac with a Metal GPU (Apple silicon or a supported AMD)")
    return [Device(info["name"], kind="gpu", vendor="Apple", memory_bytes=int(info["recommended_working_set"]),
                   properties={"emulated": False, "index": i, "unified_memory": bool(info["unified_memory"])})
            for i, info in enumerate(names)]


class MetalFactory(Factory):
    name: ClassVar[str] = "metal"
    priority: ClassVar[int] = 20

    def probe(self) -> list[Device]:
        if emulation_requested():
            # The emulator is the CPU, and slow: asked for by name, never chosen over the cpu backend.
            self.priority = 90  # type: ignore[misc]  # set per probe
            return [emulator_device()]
        self.priority = 20  # type: ignore[misc]  # set per probe
        return metal_devices()

    def create(self, device: Device, options: dict[str, Any] | None = None) -> Backend:
        from .backend import MetalBackend

        return MetalBackend(device, options)
