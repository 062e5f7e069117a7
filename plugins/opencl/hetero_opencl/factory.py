"""Finds OpenCL devices through the ICD loader and creates one backend per device.

Every way of not having a device ends in ``BackendUnavailable`` with the reason and the fix: the native module
missing or built without OpenCL, libOpenCL absent, no ICD registered, or platforms without devices.
"""

from __future__ import annotations

from typing import Any, ClassVar

from hetero.contract import BackendUnavailable, Device, Factory

from .native import load_native

INSTALL_HINT = ("install an OpenCL driver: apt-get install pocl-opencl-icd (CPU), or your GPU vendor's OpenCL ICD; "
                "check with clinfo -l")


def _short_version(info: dict) -> str:
    """"OpenCL 3.0 PoCL, C 1.2, driver 3.1+debian": what the device implements, its kernel language, the driver."""
    version = " ".join(info["version"].split()[:3])
    c_version = " ".join(info["opencl_c_version"].split()[2:3])
    return f"{version}, C {c_version}, driver {info['driver_version']}"


def list_devices() -> list[Device]:
    """Every available OpenCL device, numbered in platform order (``opencl:0``, ``opencl:1``...)."""
    native = load_native()
    try:
        platforms = native.platforms()
    except RuntimeError as exc:
        raise BackendUnavailable(f"OpenCL platform query failed: {exc}", hint=INSTALL_HINT) from exc
    if not platforms:
        raise BackendUnavailable("no OpenCL platform: the ICD loader found no driver (no ICD in /etc/OpenCL/vendors "
                                 "or OCL_ICD_VENDORS)", hint=INSTALL_HINT)
    devices = []
    for p, platform in enumerate(platforms):
        for d, info in enumerate(platform["devices"]):
            if not info["available"]:
                continue
            extensions = set(info["extensions"].split())
            devices.append(Device(
                info["name"],
                kind=info["type"],
                vendor=info["vendor"],
                memory_bytes=int(info["global_mem_bytes"]),
                properties={
                    "version": _short_version(info),
                    "fp16": "cl_khr_fp16" in extensions,
                    "subgroups": bool(extensions & {"cl_khr_subgroups", "cl_intel_subgroups"}),
                    "platform": platform["name"],
                    "platform_index": p,
                    "device_index": d,
                    "compute_units": int(info["compute_units"]),
                    "max_work_group_size": int(info["max_work_group_size"]),
                    "driver_version": info["driver_version"],
                },
            ))
    if not devices:
        names = ", ".join(p["name"] for p in platforms)
        raise BackendUnavailable(f"OpenCL platform(s) {names} report no available device", hint=INSTALL_HINT)
    return devices


class OpenCLFactory(Factory):
    name: ClassVar[str] = "opencl"
    priority: ClassVar[int] = 20

    def probe(self) -> list[Device]:
        devices = list_devices()
        # An OpenCL device that is the CPU itself (PoCL) is no faster than the native cpu backend: rank it after cpu
        # for automatic selection; GPUs and accelerators come first. Naming "opencl" explicitly always works.
        self.priority = 20 if any(d.kind != "cpu" for d in devices) else 60  # type: ignore[misc]  # set per probe
        return sorted(devices, key=lambda d: d.kind == "cpu")

    def create(self, device: Device, options: dict[str, Any] | None = None):
        from .backend import OpenCLBackend

        return OpenCLBackend(device, options)
