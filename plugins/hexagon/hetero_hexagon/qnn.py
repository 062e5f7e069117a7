"""The HTP through QNN, host side: the vendor venv holding ``onnxruntime-qnn``, the worker process that runs it, and
compiled contexts cached by content hash.

``onnxruntime-qnn`` ships QNN with ``libQnnHtp.so``. On x86-64 Linux that library runs the HTP in simulation (same
graph compiler, same fp16 / int8 arithmetic, no speed information); on a Snapdragon (aarch64 with the cDSP's
FastRPC driver) the same calls run on the NPU. It lives in a venv of its own (``python -m hetero_hexagon setup``)
because its onnxruntime must not replace or meet the user's, and it runs in a worker process so that a QNN failure
is an error, never the death of the user's process.
"""

from __future__ import annotations

import ctypes.util
import os
import platform
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero.contract import BackendUnavailable
from hetero.contract.vendor_worker import VendorEnv, VendorWorker

from .cache import cache_root, content_key

QNN_PACKAGE = "onnxruntime-qnn==2.7.0"
# fp16 on the HTP needs a SoC model: 43 is Snapdragon 8 Gen 3 (SM8650, HTP v73), one QNN's simulator knows
DEFAULT_SOC_MODEL = 43
SOC_ARCH = {43: 73, 57: 75, 60: 73, 69: 79}  # soc_model -> htp_arch, for the SoCs named in options
SETUP_COMMAND = "python -m hetero_hexagon setup"

QNN_ENV = VendorEnv(
    name="qnn",
    env_var="HETERO_QNN_VENV",
    setup_command=SETUP_COMMAND,
    install_steps=[["numpy", "onnx", QNN_PACKAGE]],
    check_code=("import importlib.metadata as m, onnxruntime, onnxruntime_qnn; "
                "print(m.version('onnxruntime-qnn'))"),
    base_pythons=("python3.11",),
    python_tag="3.11",  # the onnxruntime-qnn wheels are cp311
)


def check_toolkit() -> str:
    """The venv's onnxruntime-qnn version when it is the one this plugin was verified with, else
    ``BackendUnavailable`` saying what is there and how to replace it."""
    version = QNN_ENV.check()
    wanted = QNN_PACKAGE.split("==")[1]
    if version.split(".")[:2] != wanted.split(".")[:2]:
        raise BackendUnavailable(
            f"onnxruntime-qnn {version} in {QNN_ENV.path}; hetero-hexagon's op table was verified with {wanted}",
            hint=f"recreate the environment: {SETUP_COMMAND} --force",
        )
    return version


def mode() -> str:
    """``device`` on a Snapdragon with the cDSP driver, else ``simulator`` (libQnnHtp.so emulates the HTP)."""
    on_device = platform.machine() in ("aarch64", "arm64") and ctypes.util.find_library("cdsprpc") is not None
    return "device" if on_device else "simulator"


@dataclass(frozen=True)
class HtpOptions:
    precision: str = "fp16"  # fp16 | int8 (QDQ with a calibration set)
    soc_model: int = DEFAULT_SOC_MODEL

    def provider_options(self) -> dict[str, str]:
        options = {"backend_type": "htp", "soc_model": str(self.soc_model),
                   "htp_arch": str(SOC_ARCH.get(self.soc_model, 73))}
        if self.precision == "fp16":
            options["enable_htp_fp16_precision"] = "1"
        return options


class QnnRuntime:
    """One QNN worker per process, shared by every hexagon backend and session; compiled contexts on disk."""

    _shared: QnnRuntime | None = None
    _lock = threading.Lock()

    def __init__(self, python: Path) -> None:
        self.worker = VendorWorker(python, Path(__file__).with_name("qnn_worker.py"), name="qnn",
                                   env={"OMP_NUM_THREADS": "1"})
        self.version = ""

    @classmethod
    def shared(cls) -> QnnRuntime:
        with cls._lock:
            if cls._shared is None:
                version = check_toolkit()
                cls._shared = cls(QNN_ENV.python)
                cls._shared.version = version
            return cls._shared

    def info(self) -> dict[str, Any]:
        return self.worker.call("info", context="asking QNN what it runs on", timeout=120)

    def compile(self, model: bytes, options: HtpOptions, context: str, *,
                calibration: list[dict[str, Any]] | None = None) -> tuple[str, dict[str, list[str]]]:
        """Compile (or find in the cache) the context of ``model`` and load it in the worker; returns its key and
        input / output names."""
        key = content_key(model, repr(options), self.version, *(_feeds_digest(f) for f in calibration or []))
        folder, model_path = _stage(key, model)
        if options.precision == "int8":
            quantized = folder / "model.qdq.onnx"
            if not quantized.exists():
                self.worker.call("quantize", context=f"quantizing {context} to int8 QDQ", timeout=600,
                                 model_path=str(model_path), out_path=str(quantized), calibration=calibration or [])
            model_path = quantized
        names = self.worker.call("compile", context=f"compiling {context}", timeout=600, key=key,
                                 model_path=str(model_path), context_path=str(folder / "context.onnx"),
                                 provider_options=options.provider_options())
        return key, names

    def load_reference(self, model: bytes, context: str) -> tuple[str, list[str]]:
        """Load ``model`` on onnxruntime's CPU in the worker (float reference runs: calibration, never a claimed
        segment); returns its key and output names."""
        key = content_key(model, "cpu", self.version)
        _, model_path = _stage(key, model)
        names = self.worker.call("load_reference", context=f"loading {context} on the CPU", timeout=600, key=key,
                                 model_path=str(model_path))
        return key, names["outputs"]

    def run(self, key: str, feeds: dict[str, Any], context: str) -> list[Any]:
        return self.worker.call("run", context=f"running {context}", timeout=600, key=key, feeds=feeds)


def _stage(key: str, model: bytes) -> tuple[Path, Path]:
    """The cache folder of ``key`` with ``model.onnx`` written in it (atomically: other processes may read it)."""
    folder = cache_root() / "qnn" / key
    folder.mkdir(parents=True, exist_ok=True)
    model_path = folder / "model.onnx"
    if not model_path.exists():
        scratch = folder / f"model.{os.getpid()}.onnx"
        scratch.write_bytes(model)
        scratch.replace(model_path)
    return folder, model_path


def _feeds_digest(feeds: dict[str, Any]) -> bytes:
    parts = []
    for name in sorted(feeds):
        array = feeds[name]
        parts.append(f"{name}:{array.dtype}:{array.shape}".encode() + array.tobytes())
    return content_key(*parts).encode()
