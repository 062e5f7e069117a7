"""Token compression (hetero.llm.compress): the budget in tokens, the order, the relevant sentence kept, the no-op,
and the API options (Llm.generate compress_to, create_chat_completion compress_to, generate --compress-to)."""

from __future__ import annotations

import pytest

from hetero.cli import main
from hetero.contract import HeteroError
from hetero.llm.compress import bm25, compress_text, split_units, token_counter
from hetero.llm.needle import haystack_sentences

from .helpers import FIXTURES, load

FACT = "The secret number of the copper walrus is 417093."
QUESTION = "What is the secret number of the copper walrus?"


def words(text: str) -> int:
    return len(text.split())


def document(n: int = 60) -> str:
    sentences, _ = haystack_sentences()
    middle = n // 2
    return "".join(sentences[:middle]).strip() + " " + FACT + "".join(sentences[middle:n])


def is_subsequence(kept: list[str], units: list[str]) -> bool:
    it = iter(u.strip() for u in units)
    return all(any(k == u for u in it) for k in (k.strip() for k in kept))


def test_units_cover_the_text_exactly():
    text = 'One. Two? "Three!" said he.\nA line without an end\n\nFour (five.) six.  '
    units = split_units(text)
    assert "".join(units) == text
    assert [u.strip() for u in units] == ["One.", "Two?", '"Three!"', "said he.", "A line without an end",
                                          "Four (five.)", "six."]


def test_bm25_prefers_the_sentence_with_the_rarer_query_words():
    units = ["The cat sat on the mat.", "The walrus has a copper number.", "The mat is red.", "The dog sat."]
    scores = bm25(units, QUESTION)
    assert max(range(len(units)), key=scores.__getitem__) == 1
    assert bm25(units, "") == [0.0] * 4


def test_under_budget_is_a_no_op():
    text = document(10)
    assert compress_text(text, words(text), words) is text
    assert compress_text(text, 10 * words(text), words, query=QUESTION) is text


@pytest.mark.parametrize("share", [0.1, 0.25, 0.5, 0.9])
def test_budget_respected_order_kept_needle_kept(share):
    text = document()
    budget = int(share * words(text))
    kept = compress_text(text, budget, words, query=QUESTION)
    assert 0 < words(kept) <= budget
    assert FACT in kept
    assert is_subsequence(split_units(kept), split_units(text))
    assert words(kept) > budget - max(words(u) for u in split_units(text))  # the budget is used, not left empty


def test_budget_in_real_tokens():
    llm = load(FIXTURES / "qwen3", context=2048)
    count, _ = token_counter(llm)
    text = document(40)
    for budget in (64, 300, 700):
        kept = compress_text(text, budget, count, query=QUESTION)
        assert count(kept) <= budget
        if budget >= count(" " + FACT):
            assert FACT in kept


@pytest.mark.parametrize("where", ["after", "before"])
def test_without_a_query_the_first_two_and_last_two_sentences_are_the_instruction_and_are_kept(where):
    ask = QUESTION + " Answer with the number only."  # the question is not the last sentence
    text = document() + " " + ask if where == "after" else ask + " " + document()
    kept = compress_text(text, 80, words)
    assert QUESTION in kept and FACT in kept and words(kept) <= 80
    first, last = split_units(text)[0].strip(), split_units(text)[-1].strip()
    assert kept.startswith(first) and kept.rstrip().endswith(last)
    with pytest.raises(HeteroError, match="cannot hold the text's first two and last two"):
        compress_text(text, 5, words)


@pytest.mark.parametrize("budget", [0, -3, 2.5, True, "64"])
def test_bad_budget(budget):
    with pytest.raises(HeteroError, match="compress_to="):
        compress_text("Some text. More text.", budget, words)


def test_llm_generate_and_chat_completion_compress():
    llm = load(FIXTURES / "qwen3", context=2048)
    prompt = document(40) + " " + QUESTION
    assert len(llm.tokenize(prompt)) > 400
    llm.generate(prompt, 2, temperature=0, compress_to=400)
    assert 0 < llm.stats.prompt_tokens <= 400
    with pytest.raises(HeteroError, match="text prompt"):
        llm.generate([1, 2, 3], 2, compress_to=10)
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": prompt}]
    reply = llm.create_chat_completion(messages, max_tokens=2, temperature=0, compress_to=450)
    assert 0 < reply["usage"]["prompt_tokens"] <= 450
    assert messages[1]["content"] == prompt  # the caller's messages are not changed
    with pytest.raises(HeteroError, match="no user message"):
        llm.create_chat_completion(messages[:1], max_tokens=1, compress_to=450)
    with pytest.raises(HeteroError, match="already takes"):
        llm.create_chat_completion(messages, max_tokens=1, compress_to=5)


def test_generate_compress_to_flag(tmp_path, capsys):
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(document(40) + " " + QUESTION, encoding="utf-8")
    code = main(["generate", str(FIXTURES / "qwen3"), "-f", str(prompt_file), "-n", "2", "--temp", "0",
                 "--compress-to", "600", "-c", "2048", "--no-stream"])
    assert code == 0
    stats = capsys.readouterr().err
    prompt_tokens = int(stats.split("prompt ")[1].split(" tokens")[0])
    assert 0 < prompt_tokens <= 600
