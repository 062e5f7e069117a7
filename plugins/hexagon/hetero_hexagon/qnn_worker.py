"""The QNN side of hetero-hexagon: handlers that run in the QNN worker process, inside the venv that holds
``onnxruntime-qnn`` (never in the user's process: its onnxruntime must not meet the user's). Loaded by
``hetero.contract.vendor_worker``; imports only what that venv has.

Every session disables onnxruntime's CPU fallback (``session.disable_cpu_ep_fallback``), so a node the HTP does not
take fails the compile instead of running quietly on the host CPU: what is claimed really runs on the HTP.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import onnxruntime_qnn

ort.set_default_logger_severity(3)  # the EP's notices about Windows-only features are noise here
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
SESSIONS: dict[str, Any] = {}


def _devices() -> list[Any]:
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    if not devices:
        raise RuntimeError("onnxruntime-qnn registered no QNN device")
    return devices


def _options(provider_options: dict[str, str], context_path: str | None = None) -> Any:
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.intra_op_num_threads = 1
    if context_path is not None:
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", context_path)
        so.add_session_config_entry("ep.context_embed_mode", "1")
    so.add_provider_for_devices(_devices(), dict(provider_options))
    return so


def info() -> dict[str, Any]:
    """What this QNN is: versions, the devices onnxruntime sees, and where libQnnHtp.so lives."""
    folder = Path(onnxruntime_qnn.get_library_path()).parent
    devices = _devices()
    return {
        "onnxruntime": ort.__version__,
        "onnxruntime_qnn": getattr(onnxruntime_qnn, "__version__", ""),
        "device_types": [str(d.device.type).rsplit(".", 1)[-1] for d in devices],
        "htp_library": str(folder / "libQnnHtp.so") if (folder / "libQnnHtp.so").exists() else "",
        "machine": os.uname().machine,
    }


def compile(key: str, model_path: str, context_path: str, provider_options: dict[str, str]) -> dict[str, Any]:
    """Compile an ONNX model for the HTP into a context model at ``context_path`` (unless it exists), then load the
    context for runs under ``key``. Returns the input and output names in order."""
    if not Path(context_path).exists():
        scratch = f"{context_path}.{os.getpid()}.onnx"
        ort.InferenceSession(model_path, _options(provider_options, scratch))
        os.replace(scratch, context_path)  # atomic: another process never reads half a context
    session = ort.InferenceSession(context_path, _options(provider_options))
    SESSIONS[key] = session
    return {"inputs": [i.name for i in session.get_inputs()], "outputs": [o.name for o in session.get_outputs()]}


def load_reference(key: str, model_path: str) -> dict[str, Any]:
    """Load a float model on onnxruntime's CPU (the calibration of the LLM graphs' activations: a reference run,
    not a claimed segment, so the HTP-only rule does not apply)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    SESSIONS[key] = session
    return {"outputs": [o.name for o in session.get_outputs()]}


def run(key: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(SESSIONS[key].run(None, feeds))


def release(key: str) -> None:
    SESSIONS.pop(key, None)


def quantize(model_path: str, out_path: str, calibration: list[dict[str, np.ndarray]]) -> None:
    """int8 QDQ (uint8 activations, int8 symmetric weights, what the HTP runs) calibrated on the given feeds."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Feeds(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    quantize_static(model_path, out_path, Feeds(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, per_channel=False)

