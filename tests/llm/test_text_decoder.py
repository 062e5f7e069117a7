"""Incremental detokenization (``hetero.llm.generate.TextDecoder``): each token decoded once, not the whole reply at
every token, with characters whose UTF-8 bytes are split across tokens held back until they are whole — on the
fixture's real byte-level BPE tokenizer, alone and inside the generation loop (stop strings, streaming)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hetero.llm.generate import Generation, TextDecoder, generate_stream
from hetero.llm.sampler import Sampler, SamplingParams

from .helpers import FIXTURES, load

TEXT = "naïve café — 日本語 🦀 ok ✓ Ωμέγα"  # several characters are 2-4 tokens of one byte each here


@pytest.fixture(scope="module")
def qwen3():
    return load(FIXTURES / "qwen3", backends=["cpu"], context=256)


def _decode(llm: Any, calls: list[int] | None = None):
    def decode(ids: list[int]) -> str:
        if calls is not None:
            calls.append(len(ids))
        return llm.detokenize(ids, skip_special_tokens=True)
    return decode


def test_pieces_join_to_the_whole_decode_and_never_hold_half_a_character(qwen3):
    ids = qwen3.tokenize(TEXT, add_special_tokens=False)
    singles = [qwen3.detokenize([i]) for i in ids]
    assert sum("\ufffd" in s for s in singles) >= 10  # the premise: characters split across tokens
    decoder = TextDecoder(_decode(qwen3))
    pieces = [decoder.add(i) for i in ids]
    pieces.append(decoder.flush())
    assert "".join(pieces) == TEXT == qwen3.detokenize(ids)
    assert not any("\ufffd" in p for p in pieces)
    assert "" in pieces[:-1]  # a token that only began a character gave nothing yet


def test_each_token_is_decoded_a_bounded_number_of_times(qwen3):
    ids = qwen3.tokenize(TEXT * 20, add_special_tokens=False)
    calls: list[int] = []
    decoder = TextDecoder(_decode(qwen3, calls))
    text = "".join(decoder.add(i) for i in ids) + decoder.flush()
    assert text == TEXT * 20
    assert sum(calls) <= 12 * len(ids), (sum(calls), len(ids))  # decoding all every token: ~n^2 / 2 = 400x more
    assert max(calls) <= 10  # the longest window: one character's bytes and the piece before


def test_an_unfinished_character_at_the_end_comes_out_as_decoding_all_gives_it(qwen3):
    ids = qwen3.tokenize("ok 🦀", add_special_tokens=False)
    cut = ids[:-1]  # the crab's last byte never comes
    decoder = TextDecoder(_decode(qwen3))
    held = "".join(decoder.add(i) for i in cut)
    assert held == "ok "
    assert held + decoder.flush() == qwen3.detokenize(cut)
    assert decoder.flush() == ""


class _Scripted:
    """A token source (``generate_stream``'s ``source``, what speculative decoding plugs in) giving fixed tokens:
    the loop's text handling on a reply chosen to split characters."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def start(self, llm: Any, record: Generation, prompt: list[int], sampler: Sampler, stats: Any) -> Iterator[int]:
        return iter(self.tokens)


def _stream(llm: Any, reply: str, stop: list[str], max_tokens: int = 1000,
            calls: list[int] | None = None) -> tuple[list[str], Generation]:
    tokens = llm.tokenize(reply, add_special_tokens=False)
    record = Generation()
    pieces = list(generate_stream(llm, [1, 2, 3], min(max_tokens, len(tokens)), Sampler(SamplingParams()), stop,
                                  [], record, _decode(llm, calls), _Scripted(tokens)))
    return pieces, record


def test_the_generation_loop_streams_whole_characters_and_stops_on_multibyte_stop_strings(qwen3):
    calls: list[int] = []
    pieces, record = _stream(qwen3, TEXT * 4, [], calls=calls)
    assert "".join(pieces) == TEXT * 4 == record.text and record.finish_reason == "length"
    assert not any("\ufffd" in p for p in pieces)
    assert sum(calls) <= 12 * len(record.tokens)  # each token decoded a few times, not the reply at every token
    pieces, record = _stream(qwen3, TEXT, ["🦀"])  # the stop string's bytes are split across tokens too
    assert "".join(pieces) == TEXT[:TEXT.index("🦀")] == record.text and record.finish_reason == "stop"
    pieces, record = _stream(qwen3, TEXT, ["語 🦀"])  # one that starts on a whole character: held back until decided
    assert "".join(pieces) == TEXT[:TEXT.index("語")] == record.text
    n = len(qwen3.tokenize("ok 🦀", add_special_tokens=False)) - 1
    pieces, record = _stream(qwen3, "ok 🦀", [], max_tokens=n)  # stopped by the limit inside the crab
    assert "".join(pieces) == record.text == qwen3.detokenize(qwen3.tokenize("ok 🦀", add_special_tokens=False)[:n])
