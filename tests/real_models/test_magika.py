"""magika's content-type CNN, fed magika's own features of real files, against onnxruntime; then magika end to end
with hetero in place of its onnxruntime session. Each test runs on cpu and on opencl (the ``backend`` fixture)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from .conftest import Agreement, hetero_session, model_path, ort_runner
from .models import magika_features, magika_samples


def test_model_outputs(agreement: Agreement, backend: str) -> None:
    """A batch of ten real files, then each file alone (the batch dimension is dynamic)."""
    path = model_path("magika")
    samples = magika_samples()
    features = magika_features(list(samples.values()))
    ort_run, session = ort_runner(path), hetero_session(path, agreement, backend)
    batch = {"bytes": features}
    want = ort_run(batch)
    agreement.check_all(session.run(batch), want)
    np.testing.assert_array_equal(session.run(batch)["target_label"].argmax(1), want["target_label"].argmax(1))
    for row in features[:3]:
        one = {"bytes": row[None]}
        agreement.check_all(session.run(one), ort_run(one))
    agreement.check_hot_path()


class _HeteroAsOnnxruntime:
    """The slice of onnxruntime.InferenceSession that magika calls: run(output_names, {"bytes": rows})."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def run(self, output_names: list[str], feeds: dict[str, Any]) -> list[np.ndarray]:
        outs = self.session.run({name: np.asarray(v, dtype=np.int32) for name, v in feeds.items()})
        return [outs[name] for name in output_names]


def test_end_to_end_labels(agreement: Agreement, backend: str) -> None:
    """Magika.identify_bytes gives the same label and score with hetero doing the inference."""
    path = model_path("magika")
    from magika import Magika

    stock, ours = Magika(), Magika()
    if not hasattr(ours, "_onnx_session"):
        pytest.skip("this magika version keeps its onnxruntime session elsewhere")
    ours._onnx_session = _HeteroAsOnnxruntime(hetero_session(path, agreement, backend))
    for kind, content in magika_samples().items():
        want, got = stock.identify_bytes(content), ours.identify_bytes(content)
        assert got.output.label == want.output.label, kind
        agreement.check(f"{kind} score", np.float64(got.score), np.float64(want.score))
        agreement.calls += 1
    assert str(stock.identify_bytes(magika_samples()["png"]).output.label) == "png"  # the inputs are what they say
    agreement.check_hot_path()
