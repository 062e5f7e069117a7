"""Classical-ML tree ensembles from a PyPI wheel against onnxruntime on cpu (issue 17's "models the issue does not
name"): atspm-detector 1.1.0's 17 LightGBM models, each one ``ai.onnx.ml::TreeEnsemble`` node (ml opset 5) over
double features (25-508 of them; 300-1610 trees, 1 or 7 targets, NaN routed by nodes_missing_value_tracks_true).
Inputs: ``models.tree_rows``, each feature over the range its split thresholds span, 3 % NaN.

Bound: bit for bit against onnxruntime at one intra-op thread (both add the trees in model order, in double); the
conftest tolerance against onnxruntime's default threads (it then sums groups of trees per thread, which moves the
last bits: about 1e-15 relative).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .conftest import Agreement, hetero_session, model_path, ort_runner
from .models import MODELS, tree_rows

TREE_MODELS = [name for name, m in MODELS.items() if "trees" in m.tags]


def _all_files() -> list[Path]:
    folder = MODELS["atspm_decode"].folder()
    if folder is None:
        pytest.skip(MODELS["atspm_decode"].install_hint)
    files = sorted(p for p in (folder / "weights").rglob("*.onnx") if "funcnet" not in p.parts)
    assert len(files) == 17
    return files


@pytest.mark.parametrize("name", TREE_MODELS)
def test_atspm_catalogue_model(agreement: Agreement, name: str) -> None:
    path = model_path(name)
    session = hetero_session(path, agreement, "cpu")
    feeds = MODELS[name].feeds(MODELS[name])
    ort_run = ort_runner(path)
    for _ in range(2):  # the second run replays the recorded program
        agreement.check_all(session.run(feeds), ort_run(feeds))
    exact = ort_runner(path, threads=1)(feeds)
    for out, want in exact.items():
        np.testing.assert_array_equal(session.run(feeds)[out], want)


def test_every_atspm_tree_model_bit_for_bit() -> None:
    """All 17 files (the catalogue holds 6 of them), on 1, 7 and 64 rows; an all-NaN row takes every node's
    missing-value branch."""
    for path in _all_files():
        session = hetero_session(path)
        ort_run = ort_runner(path, threads=1)
        for rows in (1, 7, 64):
            feeds = tree_rows(path, rows, seed=rows)
            (x,) = feeds.values()
            x[0] = np.nan
            got, want = session.run(feeds), ort_run(feeds)
            for out, value in want.items():
                np.testing.assert_array_equal(got[out], value, err_msg=f"{path.name}, {rows} rows")
