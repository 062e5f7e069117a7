"""Finds the HTP: the QNN toolkit venv (onnxruntime-qnn) and whether it reaches a real NPU or its simulator."""

from __future__ import annotations

from typing import Any, ClassVar

from hetero.contract import Device, Factory


class HexagonFactory(Factory):
    name: ClassVar[str] = "hexagon"
    # After cpu when it is the simulator (slow, for checking results); first on a Snapdragon. Naming it always works.
    priority: ClassVar[int] = 70

    def probe(self) -> list[Device]:
        from .qnn import QNN_ENV, SOC_ARCH, DEFAULT_SOC_MODEL, mode

        version = QNN_ENV.check()  # BackendUnavailable with the setup command when the venv is absent or broken
        current = mode()
        self.priority = 10 if current == "device" else 70  # type: ignore[misc]  # set per probe, as opencl does
        return [Device("htp", kind="npu", vendor="Qualcomm", properties={
            "mode": current,
            "version": f"onnxruntime-qnn {version}",
            "soc_model": DEFAULT_SOC_MODEL,
            "htp_arch": SOC_ARCH[DEFAULT_SOC_MODEL],
        })]

    def create(self, device: Device, options: dict[str, Any] | None = None):
        from .backend import HexagonBackend

        return HexagonBackend(device, options)
