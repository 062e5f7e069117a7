"""Fixtures for the LLM tests (helpers in helpers.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from .helpers import FAMILIES, FIXTURES, load


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def qwen3_llm():
    """The tiny Qwen3 fixture, last-token logits, shared by the runtime tests of a module."""
    return load(FIXTURES / "qwen3")
