"""What the rknn worker process does, called through ``hetero.contract.vendor_worker``. This file runs in another
Python — the toolkit's venv on a PC, the user's own on a board — so it imports only numpy and Rockchip's packages.

On a PC ``build`` converts a segment's ONNX model with ``rknn-toolkit2``, writes the ``.rknn`` file and starts the
toolkit's simulator on it (``init_runtime()`` without a target), keeping the built model in this process: the
simulator runs only models built in the process that runs it, not a loaded ``.rknn``. On a board ``load`` opens a
``.rknn`` file with ``rknn-toolkit-lite2`` (``RKNNLite``: ``load_rknn`` + ``init_runtime(core_mask)``). ``run`` is the
same for both. The toolkit reports failure through return codes; each becomes an exception whose message names the
step (its own log lines go to stderr, which the caller shows).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

_models: dict[str, Any] = {}  # cache key -> a built RKNN (simulator) or a loaded RKNNLite (board)


def _check(code: Any, step: str) -> None:
    if code not in (0, None):
        raise RuntimeError(f"rknn {step} failed (returned {code})")


def toolkit_version() -> str:
    from importlib.metadata import version

    return version("rknn-toolkit2")


def build(key: str, onnx_path: str, rknn_path: str, target: str, quantize: bool,
          samples: list[list[np.ndarray]], optimization_level: int = 3) -> dict:
    """Convert (float16, or int8 calibrated on ``samples``), export, and start the simulator on the result."""
    from rknn.api import RKNN

    release(key)
    rknn = RKNN(verbose=False)
    _check(rknn.config(target_platform=target, optimization_level=optimization_level), "config")
    _check(rknn.load_onnx(model=onnx_path), "load_onnx")
    with tempfile.TemporaryDirectory(prefix="hetero-rknn-calib-") as folder:
        dataset = None
        if quantize:
            lines = []
            for i, sample in enumerate(samples):
                names = []
                for j, array in enumerate(sample):
                    names.append(os.path.join(folder, f"s{i}_{j}.npy"))
                    np.save(names[-1], array)
                lines.append(" ".join(names))
            dataset = os.path.join(folder, "dataset.txt")
            with open(dataset, "w") as f:
                f.write("\n".join(lines) + "\n")
        _check(rknn.build(do_quantization=quantize, dataset=dataset), f"build for {target}")
    _check(rknn.export_rknn(rknn_path), "export_rknn")
    _check(rknn.init_runtime(), "init_runtime (simulator)")
    _models[key] = rknn
    return {"rknn_bytes": os.path.getsize(rknn_path)}


def load(key: str, rknn_path: str, core_mask: int = 0) -> dict:
    """Open a built ``.rknn`` on the board's NPU (``core_mask`` 0: the runtime picks the cores)."""
    from rknnlite.api import RKNNLite

    release(key)
    lite = RKNNLite(verbose=False)
    _check(lite.load_rknn(rknn_path), f"load_rknn {rknn_path}")
    _check(lite.init_runtime(core_mask=core_mask), "init_runtime (NPU)")
    _models[key] = lite
    return {}


def has(key: str) -> bool:
    return key in _models


def run(key: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The model's outputs for ``inputs`` (in the model's input order; 4-D inputs are NCHW as in the ONNX model)."""
    model = _models[key]
    formats = ["nchw" if np.ndim(x) == 4 else "nhwc" for x in inputs]
    outputs = model.inference(inputs=[np.ascontiguousarray(x, dtype=np.float32) for x in inputs],
                              data_format=formats)
    if outputs is None:
        raise RuntimeError("rknn inference failed (returned no outputs)")
    return [np.asarray(o, dtype=np.float32) for o in outputs]


def release(key: str) -> None:
    model = _models.pop(key, None)
    if model is not None:
        model.release()


HANDLERS = {f.__name__: f for f in (toolkit_version, build, load, has, run, release)}
