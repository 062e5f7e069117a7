"""nudenet's detector (a YOLOv8n export: 64 convolutions with SiLU, upsampling, the anchor-free head) on synthetic
scenes, against onnxruntime, on cpu and on opencl (the ``backend`` fixture)."""

from __future__ import annotations

import numpy as np

from .conftest import Agreement, hetero_session, model_path, ort_runner
from .models import scene


def test_detector(agreement: Agreement, backend: str) -> None:
    """Boxes (pixels, 0-320) and class scores of 2100 anchors for two scenes, then the best detections: the same
    anchors and classes as onnxruntime's."""
    path = model_path("nudenet_yolov8n")
    ort_run, session = ort_runner(path), hetero_session(path, agreement, backend)
    for seed in (0, 1):
        feeds = {"images": scene(seed=seed)}
        want, got = ort_run(feeds), session.run(feeds)
        agreement.check_all(got, want)
        name = next(iter(want))
        assert want[name].shape == (1, 22, 2100)
        scores_want, scores_got = want[name][0, 4:], got[name][0, 4:]  # [18 classes, 2100 anchors]
        top = np.argsort(scores_want.max(0))[-5:]
        np.testing.assert_array_equal(scores_got[:, top].argmax(0), scores_want[:, top].argmax(0))
        assert set(np.argsort(scores_got.max(0))[-5:]) == set(top)
    agreement.check_hot_path()
