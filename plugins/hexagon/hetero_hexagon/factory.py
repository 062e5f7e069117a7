"""Finds the HTP: the QNN toolkit venv (onnxruntime-qnn) and whether it reaches a real NPU or its simulator."""

from __future__ import annotations

from typing import Any, ClassVar

from hetero.contract import BackendUnavailable, Device, Factory


def hvx_mode() -> str:
    """Where the HVX kernels can run here: a cDSP through FastRPC, qemu-hexagon (tests only), or nowhere."""
    from .fastrpc import open_library
    from .hvx_qemu import find_toolchain

    try:
        open_library()
        return "fastrpc"
    except BackendUnavailable:
        pass
    try:
        find_toolchain()
        return "qemu-hexagon (tests)"
    except BackendUnavailable:
        return "none (no libcdsprpc.so, no clang/lld/qemu-user)"


class HexagonFactory(Factory):
    name: ClassVar[str] = "hexagon"
    # After cpu when it is the simulator (slow, for checking results); first on a Snapdragon. Naming it always works.
    priority: ClassVar[int] = 70

    def probe(self) -> list[Device]:
        from .qnn import DEFAULT_SOC_MODEL, SOC_ARCH, check_toolkit, mode

        version = check_toolkit()  # BackendUnavailable with the fix when the venv is absent, broken or mismatched
        current = mode()
        self.priority = 10 if current == "device" else 70  # type: ignore[misc]  # set per probe, as opencl does
        return [Device("htp", kind="npu", vendor="Qualcomm", properties={
            "mode": current,
            "version": f"onnxruntime-qnn {version}; HVX kernels: {hvx_mode()}",
            "soc_model": DEFAULT_SOC_MODEL,
            "htp_arch": SOC_ARCH[DEFAULT_SOC_MODEL],
        })]

    def create(self, device: Device, options: dict[str, Any] | None = None):
        from .backend import HexagonBackend

        return HexagonBackend(device, options)
