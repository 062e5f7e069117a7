"""rapidocr-onnxruntime's PP-OCR models (text detection, recognition, direction classification) on printed text,
against onnxruntime, on cpu and on opencl (the ``backend`` fixture)."""

from __future__ import annotations

import numpy as np
import onnx

from .conftest import Agreement, hetero_session, model_path, ort_runner
from .models import ocr_crop, ocr_tensor, text_page


def test_detection(agreement: Agreement, backend: str) -> None:
    """The DBNet probability map of a printed page, at two page sizes through one session (re-planning)."""
    path = model_path("ppocr_v4_det")
    ort_run, session = ort_runner(path), hetero_session(path, agreement, backend)
    for height, width in ((480, 640), (320, 256)):
        feeds = {"x": ocr_tensor(text_page(height, width))}
        want = ort_run(feeds)
        agreement.check_all(session.run(feeds), want)
        assert (next(iter(want.values())) > 0.3).mean() > 0.01, "the page should contain detectable text"
    agreement.check_hot_path()


def _ctc_greedy(probs: np.ndarray) -> list[int]:
    """Greedy CTC: best class per step, repeats merged, blanks (class 0) dropped."""
    best = probs.argmax(-1)
    return [int(c) for i, c in enumerate(best) if c != 0 and (i == 0 or c != best[i - 1])]


def test_recognition(agreement: Agreement, backend: str) -> None:
    """Per-step character probabilities of two printed lines, and the decoded character ids."""
    path = model_path("ppocr_v4_rec")
    ort_run, session = ort_runner(path), hetero_session(path, agreement, backend)
    for text, width in (("HETERO 2026", 320), ("ONNX", 160)):
        feeds = {"x": ocr_crop(text, 48, width)}
        want, got = ort_run(feeds), session.run(feeds)
        agreement.check_all(got, want)
        name = next(iter(want))
        decoded = _ctc_greedy(want[name][0])
        assert len(decoded) >= len(text.replace(" ", "")) - 1, "the line should be readable"
        assert _ctc_greedy(got[name][0]) == decoded
    agreement.check_hot_path()


def test_classifier(agreement: Agreement, backend: str) -> None:
    """0° / 180° probabilities of upright and upside-down lines; the model as shipped (its input dims are -1)."""
    proto = onnx.load(str(model_path("ppocr_mobile_cls")))
    crops = [ocr_crop(t, 48, 192) for t in ("HETERO", "ONNX 2026", "PLACEMENT")]
    crops.append(crops[0][..., ::-1, ::-1].copy())
    feeds = {"x": np.concatenate(crops)}
    want = ort_runner(proto.SerializeToString())(feeds)
    agreement.check_all(hetero_session(proto, agreement, backend).run(feeds), want)
    flipped = next(iter(want.values()))[:, 1]
    assert flipped[3] > 0.5 > flipped[0], "the upside-down crop should be classified as 180°"
    agreement.check_hot_path()
