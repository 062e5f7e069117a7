"""Fixtures for the real-model tests: locate a model (or skip with the pip line), build hetero and onnxruntime
sessions on it, and check agreement while keeping the worst error of each model for the end-of-run summary.

Tolerance, for every float output of every call: |hetero - onnxruntime| <= ATOL + RTOL * |onnxruntime|.
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

from .models import MODELS, Feeds

ATOL = 1e-4
RTOL = 1e-3

# Known hetero bugs these models hit, with the root cause; strict=False so a fix shows up as XPASS, not a failure.


@dataclass
class Agreement:
    """Compares hetero's outputs with onnxruntime's and remembers the largest absolute difference seen."""

    label: str
    worst: float = 0.0
    placement: str = ""
    calls: int = 0

    def check(self, output: str, got: Any, want: Any) -> None:
        got, want = np.asarray(got), np.asarray(want)
        assert got.shape == want.shape, f"{self.label}: {output} has shape {got.shape}, onnxruntime {want.shape}"
        if got.size and want.dtype.kind == "f":
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            self.worst = max(self.worst, float(diff.max()))
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{self.label}: output {output}")

    def check_all(self, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
        self.calls += 1
        for name, value in want.items():
            self.check(name, got[name], value)


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


def hetero_session(model: Any, agreement: Agreement | None = None) -> hetero.Session:
    """A cpu session that lets unsupported nodes fall back to the reference (quietly; the summary lists them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hetero.HeteroWarning)
        session = hetero.Session(model, backends=["cpu"], on_fallback="silent")
    if agreement is not None:
        agreement.placement = session.placement.fallback_summary()
    return session


def ort_runner(model: Path | bytes) -> Callable[[Feeds], dict[str, np.ndarray]]:
    """onnxruntime's CPU provider as a feeds -> {output name: array} function."""
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the silero exports carry unused initializers ort warns about
    session = ort.InferenceSession(model if isinstance(model, bytes) else str(model), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(None, feeds), strict=True))
