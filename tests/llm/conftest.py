"""Fixtures for the LLM tests (helpers in helpers.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from pathlib import Path

from .helpers import FAMILIES, FIXTURES, gguf_writer, load


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def qwen3_llm():
    """The tiny Qwen3 fixture, last-token logits, shared by the runtime tests of a module."""
    return load(FIXTURES / "qwen3")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(family, type) -> a GGUF file made from the fixture folder, written once per module."""
    made: dict[tuple[str, str], Path] = {}
    root = tmp_path_factory.mktemp("gguf")

    def get(family: str, qtype: str) -> Path:
        if (family, qtype) not in made:
            path = root / f"{family}-{qtype}.gguf"
            gguf_writer().convert(FIXTURES / family, path, qtype)
            made[family, qtype] = path
        return made[family, qtype]

    return get
