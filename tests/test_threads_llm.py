"""One Llm shared by threads generates exactly what it generates alone; two models in two threads too."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

import hetero.llm
from concurrency import run_in_threads

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "llm"
PROMPTS = ["hello there", "the sky is", "one two three four", "zzz"]


def _load(family: str) -> hetero.llm.Llm:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hetero.llm.load(FIXTURES / family, backends=["cpu"], context=128, on_fallback="silent")


def _generate(llm: hetero.llm.Llm, prompt: str, seed: int) -> str:
    # sampled, not greedy: a logit moved by another thread's state would change the draws
    text = llm.generate(prompt, max_new_tokens=16, temperature=0.9, seed=seed)
    assert isinstance(text, str)
    return text


def test_one_llm_from_threads_generates_what_it_generates_alone():
    llm = _load("qwen3")
    want = {(p, s): _generate(llm, p, s) for p in PROMPTS for s in (1, 2)}

    def work(i: int) -> list[str]:
        return [_generate(llm, PROMPTS[(i + k) % len(PROMPTS)], 1 + k % 2) for k in range(4)]

    for i, texts in enumerate(run_in_threads(work, 4)):
        for k, text in enumerate(texts):
            assert text == want[PROMPTS[(i + k) % len(PROMPTS)], 1 + k % 2]


def test_a_stream_from_threads_matches_its_sequential_text():
    llm = _load("qwen3")
    want = [_generate(llm, p, 7) for p in PROMPTS]

    def work(i: int) -> str:
        stream = llm.generate(PROMPTS[i], max_new_tokens=16, temperature=0.9, seed=7, stream=True)
        return "".join(stream)

    assert run_in_threads(work, len(PROMPTS)) == want


def test_two_models_in_two_threads_give_what_each_gives_alone():
    models = [_load("qwen3"), _load("qwen2")]
    alone = [[_generate(m, p, 3) for p in PROMPTS] for m in models]
    together = run_in_threads(lambda i: [_generate(models[i], p, 3) for p in PROMPTS], 2)
    assert together == alone
