"""The model the serving tests run: the tiny Qwen3 of tests/fixtures/llm (random weights, a real tokenizer and
chat template)."""

from __future__ import annotations

import warnings
from pathlib import Path

import hetero.llm

MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "llm" / "qwen3"


def load_model(context: int = 256, embeddings: bool = False, slots: int = 1) -> hetero.llm.Llm:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hetero.llm.load(MODEL, backends=["cpu"], context=context, on_fallback="silent",
                               embeddings=embeddings, slots=slots)
