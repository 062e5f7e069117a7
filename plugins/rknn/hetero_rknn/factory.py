"""The rknn factory: which mode this machine offers (a Rockchip NPU, the PC simulator, or neither and why) and one
worker process per mode, shared by every rknn backend of the process (built models live in it)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

from hetero.contract import Backend, BackendUnavailable, Device, Factory
from hetero.contract.vendor_worker import VendorWorker

from .toolkit import SETUP_COMMAND, TOOLKIT_ENV, board, simulated_on_this_machine

HANDLERS = Path(__file__).with_name("worker_handlers.py")
SIMULATOR_PRIORITY = 90  # after cpu (50): a simulator checks what the NPU computes, it is no speed-up
DEVICE_PRIORITY = 30  # before cpu on a board

_workers: dict[str, VendorWorker] = {}
_lock = threading.Lock()


def worker(mode: str) -> VendorWorker:
    """The process's rknn worker for ``mode``: the toolkit's Python (simulator) or this one (board runtime)."""
    with _lock:
        if mode not in _workers:
            python = sys.executable if mode == "device" else TOOLKIT_ENV.python
            _workers[mode] = VendorWorker(python, HANDLERS, name="rknn")
        return _workers[mode]


class RknnFactory(Factory):
    name: ClassVar[str] = "rknn"
    priority: ClassVar[int] = DEVICE_PRIORITY if board() is not None else SIMULATOR_PRIORITY

    def __init__(self) -> None:
        self.board = board()

    def probe(self) -> list[Device]:
        if self.board is not None:
            if self.board.missing:
                raise BackendUnavailable(f"Rockchip {self.board.soc} board: {self.board.missing}",
                                         hint="install Rockchip's on-board runtime (docs/npu.md, RKNN)")
            return [Device(f"{self.board.soc} NPU", kind="npu", vendor="Rockchip",
                           properties={"mode": "device", "soc": self.board.soc})]
        why = simulated_on_this_machine()
        if why is not None:
            raise BackendUnavailable(f"no Rockchip NPU here and no simulator: {why}",
                                     hint="run on a Rockchip board with rknn-toolkit-lite2 (docs/npu.md)")
        version = TOOLKIT_ENV.check()  # BackendUnavailable naming the setup command when it is missing or broken
        return [Device("rknn simulator", kind="npu", vendor="Rockchip",
                       properties={"mode": "simulator", "version": f"rknn-toolkit2 {version}"})]

    def create(self, device: Device, options: dict[str, Any] | None = None) -> Backend:
        from .backend import RknnBackend

        mode = str(device.properties["mode"])
        toolkit = str(device.properties.get("version", "rknn-toolkit-lite2"))
        return RknnBackend(device, options, lambda: worker(mode), toolkit)


__all__ = ["SETUP_COMMAND", "RknnFactory", "worker"]
