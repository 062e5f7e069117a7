"""The hexagon backend: claims what the HTP takes (support.py) and compiles each of its segments for the HTP through
QNN; the segment then runs as one QNN graph in the worker (a whole-graph backend: no per-node kernels)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np

from hetero.contract import (
    BackendError,
    DecoderRequest,
    HostMemory,
    LlmDecoder,
    NodeInfo,
    Segment,
    Support,
    Tensor,
    dtypes,
    unsupported,
)
from hetero.contract.onnx_export import segment_to_onnx

from .qnn import DEFAULT_SOC_MODEL, HtpOptions, QnnRuntime
from .support import htp_supports, htp_takes

PRECISIONS = ("fp16", "int8")


class HexagonBackend(HostMemory):
    """The HTP behind QNN. Its tensors are host memory (the worker gets copies), so it shares a domain with cpu."""

    name: ClassVar[str] = "hexagon"
    option_keys: ClassVar[tuple[str, ...]] = ("hexagon_precision", "hexagon_soc_model", "hexagon_calibration",
                                              "hexagon_refuse")

    def __init__(self, device: Any, options: dict[str, Any] | None = None) -> None:
        super().__init__(device, options)
        precision = self.options.get("hexagon_precision", "fp16")
        if precision not in PRECISIONS:
            raise BackendError(f"option hexagon_precision={precision!r}; expected one of {PRECISIONS}")
        calibration = self.options.get("hexagon_calibration")
        if precision == "int8" and not calibration:
            raise BackendError("hexagon_precision='int8' needs option hexagon_calibration: a list of feeds "
                               "(dicts of input name -> array) to calibrate the activations' ranges")
        self.htp = HtpOptions(precision, int(self.options.get("hexagon_soc_model", DEFAULT_SOC_MODEL)))
        self.calibration: list[dict[str, np.ndarray]] = list(calibration or [])
        # op types or node names the user keeps off the HTP: fp16's range ends at 65504, and a sum of squares in a
        # hand-written LayerNorm (magika's) overflows there; the user sees it and moves that block to cpu
        self.refuse = frozenset(self.options.get("hexagon_refuse", ()))

    def supports(self, node: NodeInfo) -> Support:
        if node.op_type in self.refuse or node.node.name in self.refuse:
            return unsupported(f"{node.node.name or node.op_type} kept off the HTP by option hexagon_refuse")
        return htp_supports(node)

    def takes_op_type(self, domain: str, op_type: str) -> bool:
        return op_type not in self.refuse and htp_takes(domain, op_type)

    def compile(self, segment: Segment) -> HtpProgram:
        return HtpProgram(self, segment)

    def llm_decoder(self, request: DecoderRequest) -> LlmDecoder:
        """The LLM decoder as the HTP's static-shape graphs (``llm_decoder.HtpDecoder``), or with
        ``HETERO_HEXAGON_LLM=hvx`` its decode step on HVX (``hvx_decoder.HvxDecoder``): what ``hetero generate``
        and ``hetero bench --backend hexagon`` run."""
        from .llm_decoder import ENGINE_ENV, from_request

        engine = os.environ.get(ENGINE_ENV, "htp").strip().lower()
        return from_request(request, HtpOptions(soc_model=self.htp.soc_model), engine)


class HtpProgram:
    """One segment compiled for the HTP: a QNN context cached on disk by content, loaded in the worker."""

    def __init__(self, backend: HexagonBackend, segment: Segment) -> None:
        self.backend = backend
        self.runtime = QnnRuntime.shared()
        self.model = segment_to_onnx(segment, producer="hetero-hexagon")
        mode = backend.device.properties.get("mode", "")
        self.context = (f"segment {segment.index} ({len(segment.nodes)} nodes) on the HTP {mode} "
                        f"({backend.htp.precision}, soc {backend.htp.soc_model})")
        self.calibration = self._calibration(segment) if backend.htp.precision == "int8" else None
        self._load()

    def _calibration(self, segment: Segment) -> list[dict[str, np.ndarray]]:
        names = segment.graph.inputs
        feeds = [{n: np.asarray(f[n]) for n in names} for f in self.backend.calibration if all(n in f for n in names)]
        if not feeds:
            raise BackendError(f"int8 calibration for {self.context}: no feed in hexagon_calibration has all of "
                               f"its inputs {names}", hint="give feeds for these values (a session's run with "
                               "these outputs on cpu gives them), or use hexagon_precision='fp16'")
        return feeds

    def _load(self) -> None:
        self.key, names = self.runtime.compile(self.model, self.backend.htp, self.context,
                                               calibration=self.calibration)
        self.output_names: list[str] = names["outputs"]
        self.worker_start = self.runtime.worker.starts

    def run(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        if self.runtime.worker.starts != self.worker_start or not self.runtime.worker.alive:
            self._load()  # a new worker (after a crash) loads the cached context again
        feeds = {name: self.backend.download(t) for name, t in inputs.items()}
        outputs = self.runtime.run(self.key, feeds, self.context)
        return {name: Tensor(a, a.shape, dtypes.from_numpy(a.dtype), self.backend)
                for name, a in zip(self.output_names, outputs, strict=True)}
