"""Incremental detokenization (``hetero.llm.generate.TextDecoder``): each token decoded once, not the whole reply at
every token, with characters whose UTF-8 bytes are split across tokens held back until they are whole — on the
fixture's real byte-level BPE tokenizer, alone and inside the generation loop (stop strings, streaming)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from concurrency import run_in_threads
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


def _old_pieces(decode: Any, ids: list[int]) -> list[str]:
    """The pieces as TextDecoder gave them before its one-token memo: both windows decoded at every token."""
    tokens: list[int] = []
    start = done = 0
    out = []
    for token in ids:
        tokens.append(token)
        before, after = decode(tokens[start:done]), decode(tokens[start:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            out.append("")
            continue
        start, done = done, len(tokens)
        out.append(after[len(before):])
    out.append(decode(tokens[start:])[len(decode(tokens[start:done])):] if done != len(tokens) else "")
    return out


def test_the_one_token_memo_gives_the_same_pieces_and_one_decode_a_token_once_warm(qwen3):
    ids = qwen3.tokenize(TEXT + " def f(x):\n    return x + 1\n" * 3, add_special_tokens=False)
    singles: dict[int, str] = {}
    for round_ in range(2):  # cold memo, then the warm one a model's next generation shares
        calls: list[int] = []
        decoder = TextDecoder(_decode(qwen3, calls), singles)
        pieces = [decoder.add(i) for i in ids] + [decoder.flush()]
        assert pieces == _old_pieces(_decode(qwen3), ids)
        assert "".join(pieces) == qwen3.detokenize(ids)
        assert all(singles[t] == qwen3.detokenize([t], skip_special_tokens=True) for t in singles)
        if round_ == 1:
            # one decode a token; a window of several tokens (a character split over byte tokens) once more each
            assert len(calls) - len(ids) <= sum(n > 2 for n in calls), (len(calls), len(ids))
    ascii_ids = qwen3.tokenize("for i in range(10):\n    print(i)\n", add_special_tokens=False)
    calls = []
    decoder = TextDecoder(_decode(qwen3, calls), {i: qwen3.detokenize([i], skip_special_tokens=True)
                                                   for i in ascii_ids})
    assert "".join(decoder.add(i) for i in ascii_ids) + decoder.flush() == qwen3.detokenize(ascii_ids)
    assert len(calls) == len(ascii_ids) + 1  # one a token, and the empty window before the first


def test_a_model_shares_its_memo_across_generations_and_drops_it_with_its_tokenizer(qwen3):
    qwen3.reset()
    first = qwen3.generate("naïve café 🦀", 12, temperature=0, stop=["🦀"])
    memo = qwen3._singles
    assert memo is not None and memo[0] is qwen3.tokenizer and memo[1]
    again = qwen3.generate("naïve café 🦀", 12, temperature=0, stop=["🦀"])
    assert again == first and qwen3._singles is memo
    tokenizer = qwen3.tokenizer
    try:
        qwen3._singles = (object(), {t: "WRONG" for t in range(qwen3.config.vocab_size)})  # another tokenizer's
        assert qwen3.generate("naïve café 🦀", 12, temperature=0, stop=["🦀"]) == first
        assert qwen3._singles[0] is tokenizer and "WRONG" not in qwen3._singles[1].values()
    finally:
        qwen3._singles = None


def test_a_byte_level_tokenizer_concatenates_and_its_decoder_then_decodes_only_new_tokens(qwen3):
    import random

    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models

    from hetero.llm.tokenizer import Tokenizer

    assert qwen3.tokenizer.concatenates  # the fixture's byte-level BPE
    metaspace = HfTokenizer(models.WordLevel({"\u2581a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    metaspace.decoder = decoders.Metaspace()
    assert not Tokenizer.from_parts(metaspace).concatenates  # "▁a" alone is "a", after "b" it is " a"
    assert metaspace.decode([1, 0]) != metaspace.decode([1]) + metaspace.decode([0])
    metaspace.decoder = decoders.Sequence([decoders.ByteLevel()])
    assert not Tokenizer.from_parts(metaspace).concatenates  # only the plain byte-level decoder is trusted
    # the premise on the real tokenizer: texts join wherever both parts are whole characters
    decode = _decode(qwen3)
    vocab = qwen3.config.vocab_size
    rnd = random.Random(5)
    for _ in range(3000):
        a, b = [rnd.randrange(vocab) for _ in range(rnd.randint(1, 3))], rnd.randrange(vocab)
        if "\ufffd" not in decode(a) + decode([b]):
            assert decode([*a, b]) == decode(a) + decode([b]), (a, b)
    ids = qwen3.tokenize(TEXT + " def f(x):\n    return x + 1\n" * 3, add_special_tokens=False)
    ids[5:5] = list(qwen3.eos_ids[:1]) * 2  # special tokens (no text with skip_special_tokens) mid-text
    singles: dict[int, str] = {}
    for round_ in range(2):
        calls: list[int] = []
        decoder = TextDecoder(_decode(qwen3, calls), singles, concatenates=True)
        pieces = [decoder.add(i) for i in ids] + [decoder.flush()]
        assert pieces == _old_pieces(_decode(qwen3), ids)
        if round_ == 1:  # warm: decodes only for characters split across tokens
            assert len(calls) < len(ids) // 2, (len(calls), len(ids))
    ascii_ids = qwen3.tokenize("for i in range(10):\n    print(i)\n", add_special_tokens=False)
    calls = []
    decoder = TextDecoder(_decode(qwen3, calls), {i: decode([i]) for i in ascii_ids}, concatenates=True)
    assert "".join(decoder.add(i) for i in ascii_ids) + decoder.flush() == decode(ascii_ids)
    assert calls == [0]  # the empty window before the first token, nothing else


def test_sequences_sharing_the_memo_stream_the_same_text_from_two_threads():
    multi = load(FIXTURES / "qwen3", backends=["cpu"], slots=2)
    prompts = ["naïve café 🦀 ok", "日本語 ✓ Ωμέγα and"]
    stops = ["🦀", "Ω"]
    alone = load(FIXTURES / "qwen3", backends=["cpu"])
    want = [alone.generate(p, 20, temperature=0, stop=stops) for p in prompts]
    seqs = multi.sequences()

    def work(i: int) -> list[str]:
        return ["".join(seqs[i].generate(prompts[i], 20, temperature=0, stop=stops, stream=True)) for _ in range(3)]

    assert run_in_threads(work, 2) == [[want[0]] * 3, [want[1]] * 3]
