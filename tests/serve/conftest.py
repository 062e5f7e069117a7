"""Fixtures of the serving tests: the tiny Qwen3 model of tests/fixtures/llm (random weights, a real tokenizer and
chat template)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

import hetero.llm

MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "llm" / "qwen3"


def load_model(context: int = 256) -> hetero.llm.Llm:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hetero.llm.load(MODEL, backends=["cpu"], context=context, on_fallback="silent")


@pytest.fixture(scope="module")
def llm() -> hetero.llm.Llm:
    return load_model()
