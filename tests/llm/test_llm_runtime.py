"""The Llm runtime on the tiny Qwen3 fixture: generate, stop strings and EOS, streaming and cancellation, chat cache
reuse, rollback, context overflow and stats."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.contract import HeteroError
from hetero.llm.generate import StopMatcher, greedy_tokens

from .helpers import FIXTURES, expected, load

EXP = expected("qwen3")
PROMPT = EXP["prompts"][0]


@pytest.fixture
def llm(qwen3_llm):
    qwen3_llm.reset()
    return qwen3_llm


def test_generate_greedy_text_and_tokens(llm):
    text = llm.generate(PROMPT["text"], max_new_tokens=12, temperature=0)
    assert llm.last.tokens == PROMPT["greedy"]
    assert text == llm.detokenize(PROMPT["greedy"], skip_special_tokens=True)
    assert llm.last.finish_reason == "length"
    s = llm.stats
    assert (s.prompt_tokens, s.generated_tokens, s.cached_tokens) == (len(PROMPT["ids"]), 12, 0)
    assert s.prefill_tokens_per_second > 0 and s.decode_tokens_per_second > 0


def test_generate_defaults_to_greedy_from_generation_config(llm):
    llm.generate(PROMPT["ids"], max_new_tokens=5)
    assert llm.last.tokens == PROMPT["greedy"][:5]


def test_stream_pieces_join_to_the_text(llm):
    pieces = list(llm.generate(PROMPT["text"], max_new_tokens=12, temperature=0, stream=True))
    assert "".join(pieces) == llm.detokenize(PROMPT["greedy"], skip_special_tokens=True)
    assert len(pieces) > 1


def test_stream_cancel_keeps_cache_consistent(llm):
    stream = llm.generate(PROMPT["text"], max_new_tokens=12, temperature=0, stream=True)
    next(stream)
    stream.close()
    assert llm.last.finish_reason == "cancelled"
    n = len(llm.last.tokens)
    assert llm.tokens == PROMPT["ids"] + PROMPT["greedy"][: n - 1]  # the last sampled token was never fed
    # continuing from the cache gives the same greedy tokens as a fresh run
    assert greedy_tokens(llm, PROMPT["ids"] + PROMPT["greedy"][:n], 3) == PROMPT["greedy"][n:n + 3]


def test_sampled_generation_is_reproducible(llm):
    a = llm.generate(PROMPT["text"], max_new_tokens=10, temperature=1.0, top_p=0.9, seed=5)
    tokens = list(llm.last.tokens)
    b = llm.generate(PROMPT["text"], max_new_tokens=10, temperature=1.0, top_p=0.9, seed=5)
    assert a == b and llm.last.tokens == tokens


def test_stop_string_truncates(llm):
    full = llm.detokenize(PROMPT["greedy"], skip_special_tokens=True)
    stop = full[3:6]
    text = llm.generate(PROMPT["text"], max_new_tokens=12, temperature=0, stop=[stop, "never-there"])
    assert text == full[: full.index(stop)]
    assert llm.last.finish_reason == "stop"
    pieces = list(llm.generate(PROMPT["text"], max_new_tokens=12, temperature=0, stop=stop, stream=True))
    assert "".join(pieces) == text


def test_stop_matcher_holds_back_partial_matches():
    m = StopMatcher(["<end>", "xy"])
    assert m.safe_end("hello <en") == len("hello ")
    assert m.safe_end("abc x") == 4
    assert m.safe_end("abc") == 3
    assert m.find("ab<end>cd") == 2 and m.find("abc") == -1
    assert m.find("aaxy", start=3) == 2  # a match straddling the emitted part is still found


def test_eos_ends_generation(llm):
    eos = PROMPT["greedy"][4]  # pretend the 5th greedy token is EOS
    llm.tokenizer.eos_ids = (eos,)
    try:
        llm.generate(PROMPT["ids"], max_new_tokens=12, temperature=0)
    finally:
        llm.tokenizer.eos_ids = tuple(EXP["eos_ids"])
    first = PROMPT["greedy"].index(eos)
    assert llm.last.tokens == PROMPT["greedy"][:first]
    assert llm.last.finish_reason == "eos"


def test_chat_reuses_the_cache_across_turns(llm):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    reply = llm.chat(messages, max_new_tokens=6, temperature=0)
    first_prompt = len(llm.last.prompt_tokens)
    cached_after_turn = len(llm.tokens)
    assert cached_after_turn == first_prompt + 5  # the last sampled token is not fed
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And of Germany?"}]
    llm.chat(messages, max_new_tokens=4, temperature=0)
    s = llm.stats
    assert s.cached_tokens >= first_prompt  # at least the whole first prompt was reused
    assert s.prefill_tokens == s.prompt_tokens - s.cached_tokens < s.prompt_tokens
    # the cached run gives the same tokens as a fresh one
    tokens = list(llm.last.tokens)
    fresh = load(FIXTURES / "qwen3")
    fresh.chat(messages, max_new_tokens=4, temperature=0)
    assert fresh.last.tokens == tokens and fresh.stats.cached_tokens == 0


def test_rollback_to_common_prefix_matches_fresh_logits(llm):
    ids = EXP["prompts"][1]["ids"]
    llm.prefill(ids)
    other = [*ids[:10], 5, 6, 7]
    logits = llm.prefill(other)
    assert llm.stats.cached_tokens == 10 and llm.stats.prefill_tokens == 3
    assert llm.tokens == other
    fresh = load(FIXTURES / "qwen3")
    np.testing.assert_allclose(logits, fresh.prefill(other), atol=1e-5)
    # asking for the cached prompt again recomputes only its last token
    llm.prefill(other)
    assert llm.stats.prefill_tokens == 1
    llm.rollback(4)
    assert llm.tokens == other[:4]
    with pytest.raises(HeteroError):
        llm.rollback(10)


def test_context_overflow_is_an_error():
    small = load(FIXTURES / "qwen3", context=20)
    with pytest.raises(HeteroError, match="context holds 20"):
        small.prefill(list(range(21)))
    small.generate(list(range(15)), max_new_tokens=10, temperature=0)  # a full context ends it, text kept
    assert small.last.finish_reason == "length" and small.last.context_full
    assert len(small.last.tokens) == 5 and len(small.tokens) == 19  # the last token sampled is never fed
    small.reset()
    small.generate(list(range(15)), max_new_tokens=6, temperature=0)  # 15 + 5 fed tokens fit


def test_bad_inputs(llm):
    with pytest.raises(HeteroError, match="outside the vocabulary"):
        llm.prefill([1, 10**6])
    with pytest.raises(HeteroError, match="empty"):
        llm.prefill([])
    with pytest.raises(HeteroError, match="unknown sampling"):
        llm.chat([{"role": "user", "content": "hi"}], warmth=3)
    with pytest.raises(HeteroError, match="roles must be"):
        llm.chat([{"role": "wizard", "content": "hi"}])


def test_forward_needs_a_tokenizer_only_for_text():
    from hetero.llm.synthetic import load_synthetic

    tiny = load_synthetic("tiny", context=32, on_fallback="silent", progress=False)
    assert tiny.generate([1, 2, 3], max_new_tokens=3, temperature=0) == ""
    assert len(tiny.last.tokens) == 3
    with pytest.raises(HeteroError, match="no tokenizer"):
        tiny.generate("hello")


def test_step_outputs_are_built_once_and_again_when_a_layer_is_exposed():
    model = load(FIXTURES / "qwen3", backends=["cpu"], context=64)
    wanted = model._step_outputs()
    assert model._step_outputs() is wanted and wanted[0] == "logits"
    text = model.generate("hello there", 6, temperature=0)
    model.expose_hidden([0])  # a new hidden_layers tuple: the next step reads layer 0's output too
    wider = model._step_outputs()
    assert wider is not wanted and model._layer_outputs[0] in wider and model._step_outputs() is wider
    assert model.generate("hello there", 6, temperature=0) == text
    rows = model.hidden(0, 0, len(model.tokens))
    assert rows.shape[0] == len(model.tokens) and np.isfinite(rows).all() and np.abs(rows[-1]).sum() > 0
