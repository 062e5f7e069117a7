"""silero-vad's ONNX variants, streamed over speech-like audio chunk by chunk, against onnxruntime.

Each runtime carries its own recurrent state from chunk to chunk (as silero's own iterator does), so any error that
the state accumulates over the stream shows up in the later chunks' probabilities and in the final state. Each test runs
on cpu and on opencl (the ``backend`` fixture).
"""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import Agreement, hetero_session, model_path, ort_runner
from .models import SILERO_IO, silero_chunks, silero_stream, speech_like_audio

SECONDS = 3.2  # two talk / pause cycles: 100 chunks at 16 kHz

STREAMED = [
    pytest.param("silero_vad", 16000, id="silero_vad-16k"),
    pytest.param("silero_vad", 8000, id="silero_vad-8k"),
    pytest.param("silero_vad_16k_op15", 16000, id="op15-16k"),
    pytest.param("silero_vad_op18_ifless", 16000, id="op18_ifless-16k"),
    pytest.param("silero_vad_op18_ifless", 8000, id="op18_ifless-8k"),
    pytest.param("silero_vad_half", 16000, id="half-16k"),
    pytest.param("silero_vad_openvino_16k", 16000, id="openvino-16k"),
]


def _same_decisions(got: np.ndarray, want: np.ndarray, threshold: float = 0.5) -> None:
    """Speech / not-speech per chunk must agree, except within the tolerance band around the threshold."""
    clear = np.abs(want - threshold) > 1e-3
    np.testing.assert_array_equal(got[clear] > threshold, want[clear] > threshold)


@pytest.mark.parametrize(("name", "sr"), STREAMED)
def test_stream(name: str, sr: int, agreement: Agreement, backend: str) -> None:
    path = model_path(name)
    io_spec = SILERO_IO[name]
    chunks = list(silero_chunks(speech_like_audio(SECONDS, sr), sr))
    want_probs, want_state = silero_stream(ort_runner(path), io_spec, chunks, sr)
    got_probs, got_state = silero_stream(hetero_session(path, agreement, backend).run, io_spec, chunks, sr)
    agreement.calls = len(chunks)
    agreement.check("probabilities", got_probs, want_probs)
    for state_name, value in want_state.items():
        agreement.check(f"final {state_name}", got_state[state_name], value)
    _same_decisions(got_probs, want_probs)
    assert want_probs.max() > 0.5 > want_probs.min(), "the audio should hold both speech-like and silent chunks"
    agreement.check_hot_path()  # after the stream: the If bodies' child sessions exist by now


def test_sequence_blocks(agreement: Agreement, backend: str) -> None:
    """The batched export: blocks of frames per call, LSTM h / c carried from one block to the next."""
    path = model_path("silero_vad_16k_sequence")
    io_spec = SILERO_IO["silero_vad_16k_sequence"]
    frames = np.concatenate(list(silero_chunks(speech_like_audio(SECONDS))))
    blocks = [frames[:40], frames[40:]]  # uneven blocks: the session re-plans for a second input shape
    want_probs, want_state = silero_stream(ort_runner(path), io_spec, blocks)
    got_probs, got_state = silero_stream(hetero_session(path, agreement, backend).run, io_spec, blocks)
    agreement.calls = len(blocks)
    agreement.check("speech_probs", got_probs, want_probs)
    for state_name, value in want_state.items():
        agreement.check(f"final {state_name}", got_state[state_name], value)
    _same_decisions(got_probs, want_probs)
    agreement.check_hot_path()
