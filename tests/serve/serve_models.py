"""The model the serving tests run: the tiny Qwen3 of tests/fixtures/llm (random weights, a real tokenizer and
chat template)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

import hetero.llm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llm"
MODEL = FIXTURES / "qwen3"


def load_model(context: int = 256, embeddings: bool = False, slots: int = 1) -> hetero.llm.Llm:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hetero.llm.load(MODEL, backends=["cpu"], context=context, on_fallback="silent",
                               embeddings=embeddings, slots=slots)


def load_family(family: str, **options) -> hetero.llm.Llm:
    """The fixture model of ``family`` (qwen3, qwen3_5, ...) on the cpu, with a 256-token context."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hetero.llm.load(FIXTURES / family, backends=["cpu"], context=256, on_fallback="silent", **options)


def token_ids(n: int, seed: int) -> list[int]:
    """``n`` seeded token ids of the fixtures' vocabulary (no special tokens)."""
    return [int(t) for t in np.random.default_rng(seed).integers(3, 200, n)]
