"""The rknn backend: claims the nodes the RKNN compiler takes (``support.py``), and compiles each segment it got into
one RKNN model, built and run in a worker process (``worker_handlers.py``).

Session options (``Session(..., options={...})``):

* ``rknn_target`` — the SoC to build for: rk3588 (default; on a board, the board's own), rk3576, rk3568, rk3566,
  rk3562; other names the toolkit knows are passed through.
* ``rknn_dtype`` — ``"float16"`` (default: the NPU's float) or ``"int8"`` (quantized with ``rknn_calibration``).
* ``rknn_calibration`` — int8 only: a list of samples, each a dict {value name: array} holding every input of every
  rknn segment (the model's inputs; for a segment that starts after a cpu one, the intermediate values it reads).
* ``rknn_timeout`` — seconds a build or a run may take in the worker before it is stopped (default 600).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from hetero.contract import (
    BackendError,
    HeteroError,
    HostMemory,
    Kernel,
    NodeInfo,
    Segment,
    Support,
    Tensor,
    static_shape,
)
from hetero.contract.reference import ReferenceKernel
from hetero.contract.vendor_worker import VendorWorker

from . import cache
from .export import segment_to_onnx
from .support import LAYOUT_OPS, rknn_supports, rknn_takes
from .toolkit import DEFAULT_TARGET, TARGETS

DTYPES = ("float16", "int8")
_TARGET_NAME = re.compile(r"^r[kv]\d{4}[a-z]?$")


def _options(options: dict[str, Any], default_target: str) -> tuple[str, str, list[dict[str, np.ndarray]], float]:
    target = str(options.get("rknn_target") or default_target).lower()
    if not _TARGET_NAME.match(target):
        raise HeteroError(f"rknn_target={target!r} is not a Rockchip SoC name; expected one of {', '.join(TARGETS)}")
    dtype = str(options.get("rknn_dtype", "float16"))
    if dtype not in DTYPES:
        raise HeteroError(f"rknn_dtype={dtype!r}; expected one of {', '.join(DTYPES)}")
    samples = options.get("rknn_calibration") or []
    if dtype == "int8" and not samples:
        raise HeteroError("rknn_dtype='int8' needs rknn_calibration: a list of samples, each a dict "
                          "{input name: array} like the feeds of Session.run")
    if not isinstance(samples, list | tuple) or not all(isinstance(s, dict) for s in samples):
        raise HeteroError("rknn_calibration must be a list of dicts {value name: array}")
    timeout = float(options.get("rknn_timeout", 600.0))
    return target, dtype, list(samples), timeout


def _describe(segment: Segment) -> str:
    ops = Counter(n.node.op_type for n in segment.nodes)
    listed = ", ".join(f"{op}×{count}" for op, count in ops.most_common(4))
    return f"segment {segment.index} ({len(segment.nodes)} nodes: {listed}{', ...' if len(ops) > 4 else ''})"


class RknnBackend(HostMemory):
    """One NPU target. Its tensors are host arrays: the worker process gets them through a pipe."""

    name: ClassVar[str] = "rknn"
    memory_domain: ClassVar[str] = "host"
    option_keys: ClassVar[tuple[str, ...]] = ("rknn_target", "rknn_dtype", "rknn_calibration", "rknn_timeout")

    def __init__(self, device: Any, options: dict[str, Any] | None, worker: Callable[[], VendorWorker],
                 toolkit: str) -> None:
        super().__init__(device, options)
        self.mode = str(device.properties.get("mode", "simulator"))
        default = str(device.properties.get("soc", DEFAULT_TARGET))
        self.target, self.dtype, self.samples, self.timeout = _options(self.options, default)
        self.worker = worker  # the process's shared worker for this mode, started on first use
        self.toolkit = toolkit

    def supports(self, node: NodeInfo) -> Support:
        return rknn_supports(node)

    def takes_op_type(self, domain: str, op_type: str) -> bool:
        return rknn_takes(domain, op_type)

    def compile(self, segment: Segment) -> RknnProgram | None:
        if all(n.domain == "" and n.op_type in LAYOUT_OPS for n in segment.nodes):
            return None  # only data movement: the core runs it on the host with kernel() below
        program = RknnProgram(self, segment)
        program.prepare()
        return program

    def kernel(self, node: NodeInfo) -> Kernel:
        """The numpy reference, for the nodes of layout-only segments (host memory: reshapes are views)."""
        return ReferenceKernel(node, self)

    def calibration_for(self, segment: Segment, what: str) -> list[list[np.ndarray]]:
        """Each calibration sample's arrays for the segment's inputs, in order (int8), checked against the shapes."""
        if self.dtype != "int8":
            return []
        rows = []
        for i, sample in enumerate(self.samples):
            row = []
            for name in segment.graph.inputs:
                if name not in sample:
                    raise HeteroError(
                        f"rknn int8 calibration sample {i} has no value {name!r}, which {what} reads",
                        hint="add it to each sample (onnxruntime computes it when the value is added to the model's "
                             "outputs), or use rknn_dtype='float16'")
                array = np.asarray(sample[name], dtype=np.float32)
                want = static_shape(segment.graph.values[name])
                if array.shape != want:
                    raise HeteroError(f"rknn int8 calibration sample {i}: {name!r} has shape {array.shape}, "
                                      f"{what} reads it as {want}")
                row.append(array)
            rows.append(row)
        return rows


class RknnProgram:
    """A segment built into one RKNN model: ``run`` sends its inputs to the worker and returns the outputs."""

    def __init__(self, backend: RknnBackend, segment: Segment) -> None:
        self.backend = backend
        self.segment = segment
        self.inputs = list(segment.graph.inputs)
        self.outputs = list(segment.graph.outputs)
        self.shapes = {name: static_shape(segment.graph.values[name]) for name in self.outputs}
        self.what = _describe(segment)
        onnx_bytes = segment_to_onnx(segment)
        self.samples = backend.calibration_for(segment, self.what)
        self.entry = cache.entry(cache.build_key(onnx_bytes, backend.target, backend.dtype, self.samples))
        self.entry.write_onnx(onnx_bytes)
        self._worker_start = -1  # the worker process (its start count) holding this model

    @property
    def key(self) -> str:
        return self.entry.key

    def prepare(self) -> None:
        """Build (simulator) or load (board) the model in the current worker process, unless it holds it already."""
        worker = self.backend.worker()
        if worker.alive and worker.starts == self._worker_start:
            return
        b = self.backend
        if b.mode == "device":
            if not self.entry.built:
                raise BackendError(
                    f"no built RKNN model for {self.what} ({b.target}, {b.dtype}) in {self.entry.folder}",
                    hint="build it on a PC: run the same session there with the rknn backend (simulator) and "
                         f"rknn_target={b.target!r}, then copy that folder's {self.key}.* files here")
            worker.call("load", context=f"loading {self.what} on the {b.target} NPU", timeout=b.timeout,
                        key=self.key, rknn_path=str(self.entry.rknn))
        elif not (worker.alive and worker.call("has", context="asking the worker", timeout=60, key=self.key)):
            started = time.perf_counter()
            facts = worker.call("build", context=f"building {self.what} for {b.target} ({b.dtype})",
                                timeout=b.timeout, key=self.key, onnx_path=str(self.entry.onnx),
                                rknn_path=str(self.entry.rknn), target=b.target, quantize=b.dtype == "int8",
                                samples=self.samples)
            self.entry.record({"target": b.target, "dtype": b.dtype, "toolkit": b.toolkit, "inputs": self.inputs,
                               "outputs": self.outputs, "segment": self.what, "calibration_samples": len(self.samples),
                               "build_seconds": round(time.perf_counter() - started, 2), **facts})
        self._worker_start = worker.starts

    def run(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        self.prepare()  # again after a worker crash: the new process has no model yet
        b = self.backend
        where = "NPU" if b.mode == "device" else "simulator"
        arrays = [np.asarray(inputs[name].numpy(), dtype=np.float32) for name in self.inputs]
        outs = b.worker().call("run", context=f"running {self.what} on the {b.target} {where}", timeout=b.timeout,
                                key=self.key, inputs=arrays)
        if len(outs) != len(self.outputs):
            raise BackendError(f"rknn returned {len(outs)} outputs for {self.what}; the segment has "
                               f"{len(self.outputs)} ({', '.join(self.outputs)})")
        result = {}
        for name, array in zip(self.outputs, outs, strict=True):
            want = self.shapes[name]
            if array.shape != want:
                if array.size != int(np.prod(want)):
                    raise BackendError(f"rknn returned {name!r} of shape {array.shape} for {self.what}; "
                                       f"expected {want}")
                array = array.reshape(want)  # the toolkit may drop or add unit dims
            result[name] = b.upload(array)
        return result
