"""Fixtures of the serving tests: the tiny Qwen3 model of tests/fixtures/llm (random weights, a real tokenizer and
chat template)."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

import hetero.llm

from .serve_models import load_model


@pytest.fixture(scope="module")
def llm() -> hetero.llm.Llm:
    return load_model(embeddings=True)
