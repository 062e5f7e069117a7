"""A generation that fills the context stops with finish_reason "length" and keeps its text; the CLI says so, and
``chat`` keeps going by dropping its oldest turns."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from cli_terminal import run_cli

import hetero.llm

MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "llm" / "qwen3"


def test_a_generation_that_fills_the_context_keeps_its_text():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = hetero.llm.load(MODEL, backends=["cpu"], context=24, on_fallback="silent")
    prompt = llm.tokenize("one two three")
    text = llm.generate(prompt, max_new_tokens=100, temperature=0.8, seed=1)
    record = llm.last
    assert record.finish_reason == "length" and record.context_full
    assert len(prompt) + len(record.tokens) == llm.context  # every position used, none past it
    assert text == record.text and text == llm.detokenize(record.tokens, skip_special_tokens=True)
    # max_new_tokens reached first is "length" too, but not a full context
    llm.generate(prompt, max_new_tokens=3, temperature=0.8, seed=1)
    assert llm.last.finish_reason == "length" and not llm.last.context_full


def test_generate_says_the_context_is_full():
    result = run_cli(["generate", "-m", str(MODEL), "-p", "one two", "-n", "200", "-c", "20", "--temp", "0.8",
                      "--seed", "1"])
    assert result.returncode == 0, result.stderr
    assert "hetero: warning: the context of 20 tokens is full" in result.stderr
    assert result.stdout.strip()


def test_chat_drops_old_turns_instead_of_failing_on_a_full_context():
    turns = "".join(f"turn {i}\n" for i in range(8)) + "/bye\n"
    result = run_cli(["chat", str(MODEL), "-n", "4", "-c", "128", "--temp", "0"], stdin=turns, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "hetero: error" not in result.stderr
    assert len(re.findall(r"generated \d+ tokens", result.stderr)) == 8  # every turn answered
    assert "message(s) were dropped" in result.stderr
