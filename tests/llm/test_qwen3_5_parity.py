"""Qwen3.5 / Qwen3.5-MoE / Qwen3-Next (hybrid Gated DeltaNet + gated attention) against transformers: logits of
short prompts and of prompts crossing several 64-token chunks (one ending mid-chunk), greedy continuations, chat
turns with a rollback into the middle of the previous turn, and the chunked vs recurrent prefill.

Tolerance: float32, max |logit difference| 1e-4 (logits span about ±5)."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.llm.generate import greedy_tokens

from .helpers import FIXTURES, expected, load, reference_logits

HYBRID = ["qwen3_5", "qwen3_5_moe", "qwen3_5_next"]
TOL = 1e-4
# Two hetero runs whose chunked prefills split the same tokens at different offsets sum in a different order: on an
# AVX2 machine (8-wide accumulators) a few of 34,880 MoE logits differ by 1.1e-4 between them.
REALIGNED_TOL = 3e-4


@pytest.fixture(params=HYBRID)
def hybrid(request) -> str:
    return request.param


def test_short_prompt_logits_match_transformers(hybrid):
    llm = load(FIXTURES / hybrid, all_logits=True)
    ref = reference_logits(hybrid)
    for i, prompt in enumerate(expected(hybrid)["prompts"]):
        llm.reset()
        logits = llm.prefill(prompt["ids"])
        assert np.abs(logits - ref[f"prompt{i}"]).max() < TOL


@pytest.mark.parametrize("prefill_chunk", [0, 48])
def test_long_prompt_logits_match_transformers(hybrid, prefill_chunk):
    """200 tokens (3 chunks + 8) and 100 tokens (1 chunk + 36), in one call or in calls of 48 tokens."""
    llm = load(FIXTURES / hybrid, all_logits=True, prefill_chunk=0)
    ref = reference_logits(hybrid)
    for i, prompt in enumerate(expected(hybrid)["long_prompts"]):
        llm.reset()
        ids, step = prompt["ids"], prefill_chunk or len(prompt["ids"])
        logits = np.concatenate([llm.forward(ids[s:s + step]) for s in range(0, len(ids), step)])
        assert np.abs(logits[prompt["rows"]] - ref[f"long{i}"]).max() < TOL


def test_greedy_tokens_match_transformers(hybrid):
    llm = load(FIXTURES / hybrid)
    exp = expected(hybrid)
    for prompt in exp["prompts"] + exp["long_prompts"]:
        llm.reset()
        assert greedy_tokens(llm, prompt["ids"], len(prompt["greedy"])) == prompt["greedy"]
    chat = exp["chat"]
    llm.reset()
    assert greedy_tokens(llm, chat["ids"], len(chat["greedy"])) == chat["greedy"]
    last = llm.prefill(chat["ids"])
    assert np.abs(last[-1] - reference_logits(hybrid)["chat_last"][0]).max() < TOL


def test_rollback_into_previous_turn_equals_fresh_run(hybrid):
    """Turn 1: a long prompt and a greedy answer; turn 2 shares only part of turn 1's prompt (the cache rolls back
    into the middle of it, mid-chunk), then generates: logits and tokens equal a fresh model's."""
    exp = expected(hybrid)
    long_ids = exp["long_prompts"][0]["ids"]
    llm = load(FIXTURES / hybrid, all_logits=True)
    turn1 = long_ids[:150]
    answer = greedy_tokens(llm, turn1, 6)
    assert len(llm.tokens) >= 150
    turn2 = long_ids[:90] + exp["chat"]["ids"]  # diverges at 90: inside turn 1's second chunk
    got = llm.prefill(turn2)
    assert llm.stats.cached_tokens == 90
    fresh = load(FIXTURES / hybrid, all_logits=True)
    want = fresh.prefill(turn2)
    np.testing.assert_allclose(got, want[-got.shape[0]:], atol=REALIGNED_TOL)
    assert greedy_tokens(llm, turn2, 8) == greedy_tokens(fresh, turn2, 8)
    assert answer  # turn 1 really generated


def test_chunked_prefill_equals_recurrent(hybrid):
    """One call for the whole prompt (chunked form) vs one token per call (the recurrence)."""
    ids = expected(hybrid)["long_prompts"][1]["ids"]
    one = load(FIXTURES / hybrid, all_logits=True, prefill_chunk=0)
    full = one.prefill(ids)
    step = load(FIXTURES / hybrid, all_logits=True, prefill_chunk=1)
    rows = np.concatenate([step.forward([t]) for t in ids])
    np.testing.assert_allclose(rows, full, atol=TOL)
