"""Whole-decoder backends: an NPU runs an LLM as its own compiled static-shape graphs (a prefill chunk and a decode
step with the KV cache as graph inputs and outputs), not as hetero's graph of ops. ``hetero.llm.load`` asks the
first backend the user named for one (``Backend.llm_decoder``) when its device is an NPU or a DSP (``Device.kind``);
when it gives one, every step of the ``Llm`` runs there, and ``None`` (the default) keeps the usual path through a
session.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class DecoderRequest:
    """What a backend gets to build a decoder from."""

    config: dict[str, Any]  # the model's config.json
    has: Callable[[str], bool]  # whether a tensor of this Hugging Face name exists
    tensor: Callable[[str, tuple[int, ...]], np.ndarray]  # the float32 tensor of a name, checked against a shape
    context: int  # KV cache positions
    quant: str | None  # the quantization the user asked for ("q4", "q8_sym_b32"...), None for the stored weights


class LlmDecoder(Protocol):
    """A decoder a backend compiled. ``run`` gets token ids and how many cached positions precede them (positions
    past that are forgotten: rolling back is running from an earlier ``past``) and returns float32 logits
    ``[len(ids), vocab]``."""

    name: str  # what runs the steps, for reports: "hexagon (HTP simulator, q4)"
    note: str  # a caveat to print next to speeds ("" when none): a simulator's speed is not the device's

    def run(self, ids: Sequence[int], past: int) -> np.ndarray: ...

    def close(self) -> None: ...
