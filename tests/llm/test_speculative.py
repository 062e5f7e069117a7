"""Speculative decoding on the tiny fixtures: greedy output token for token that of plain decoding on every family
(dense, MoE, hybrid) with drafts accepted in full, in part and not at all; the hybrid models' state after rejected
drafts against a fresh run; hidden states handed to drafters; the draft model's vocabulary check."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest

from conftest import backend_ok
from hetero.contract import HeteroError
from hetero.contract.quant import dequantize, weight_format
from hetero.llm.speculative import Draft, DraftModel, Lookahead, Speculation, make_drafter
from hetero.llm.speculative.draft_model import MAX_DRAFT, draft_vocabulary
from hetero.llm.speculative.lookahead import MAX_MATCH, confidence_class
from hetero.llm.speculative.policy import COLD_RUNS, DraftPolicy
from hetero.runtime.blas_threads import blas_threads

from .helpers import FIXTURES, copy_model, load

ALL = ["qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe", "qwen3_5_next"]
HYBRID = ["qwen3_5", "qwen3_5_moe", "qwen3_5_next"]
BACKENDS = ["cpu", "opencl"]
PROMPT = [5, 17, 300, 2, 9, 44, 81, 5, 17, 300]


def _backend(name: str) -> None:
    ok, why = backend_ok(name)
    if not ok:
        pytest.skip(why)


class Scripted:
    """Drafts the plain greedy continuation (known in advance) with scripted mistakes: step i proposes k tokens
    of which the first ``i % (k + 1)`` are right, so steps accept all, some and none of their draft."""

    def __init__(self, truth: list[int], prompt_len: int, max_draft: int = 4, hidden_layers: Sequence[int] = ()):
        self.truth, self.prompt_len, self.max_draft = truth, prompt_len, max_draft
        self.hidden_layers = tuple(hidden_layers)
        self.steps = 0
        self.received: list[tuple[int, list[int], dict[int, np.ndarray]]] = []
        self.prompt_hidden: dict[int, np.ndarray] = {}

    def reset(self) -> None:
        self.steps = 0

    def begin(self, prompt, hidden) -> None:
        self.prompt_hidden = {k: v.copy() for k, v in hidden.items()}

    def draft(self, history, k):
        done = len(history) - self.prompt_len
        right = self.truth[done:done + k]
        good = self.steps % (k + 1)
        self.steps += 1
        return [t if i < good else (t + 1) % 320 for i, t in enumerate(right)]

    def accept(self, n_accepted, tokens, hidden) -> None:
        self.received.append((n_accepted, list(tokens), {k: v.copy() for k, v in hidden.items()}))


def _plain(llm, prompt, n):
    llm.reset()
    llm.generate(prompt, n, temperature=0)
    return list(llm.last.tokens)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ALL)
def test_greedy_output_is_plain_decoding(family, backend):
    _backend(backend)
    llm = load(FIXTURES / family, backends=[backend], kv_cache="f16")
    want = _plain(llm, PROMPT, 40)
    for k in (1, 4, 7):
        drafter = Scripted(want, len(PROMPT), max_draft=k)
        llm.reset()
        llm.generate(PROMPT, 40, temperature=0, spec=Speculation(drafter, adaptive=False))
        assert list(llm.last.tokens) == want, k
        assert llm.stats.verify_steps > 0 and 0 < llm.stats.accepted_tokens < llm.stats.drafted_tokens
    for drafter in (Lookahead(min_ngram=1), Lookahead()):
        llm.reset()
        llm.generate(PROMPT, 40, temperature=0, spec=Speculation(drafter, adaptive=False))
        assert list(llm.last.tokens) == want


@pytest.mark.parametrize("family", HYBRID)
def test_hybrid_state_after_rejected_drafts_is_a_fresh_runs(family):
    """After a speculative generation (rollbacks into verify blocks all along), the next step's logits equal those
    of a model that only ever saw the committed tokens."""
    _backend("cpu")
    spec_llm = load(FIXTURES / family, backends=["cpu"])
    want = _plain(load(FIXTURES / family, backends=["cpu"]), PROMPT, 30)
    drafter = Scripted(want, len(PROMPT), max_draft=5)
    spec_llm.generate(PROMPT, 30, temperature=0, spec=Speculation(drafter, adaptive=False))
    assert spec_llm.stats.drafted_tokens > spec_llm.stats.accepted_tokens  # drafts were rejected
    history = PROMPT + list(spec_llm.last.tokens)
    fresh = load(FIXTURES / family, backends=["cpu"], prefill_chunk=0)
    fresh.prefill(history[:-1])
    expected = fresh.forward(history[-1:])
    got = spec_llm.forward(history[len(spec_llm.tokens):]) if len(spec_llm.tokens) < len(history) else None
    if got is None:  # the cache holds more than the history (the last step's extra tokens): roll back to it
        spec_llm.rollback(len(history) - 1)
        got = spec_llm.forward(history[-1:])
    np.testing.assert_allclose(got, expected, atol=2e-4)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_drafters_get_the_hidden_states_of_the_committed_tokens(family):
    _backend("cpu")
    llm = load(FIXTURES / family, backends=["cpu"])
    want = _plain(llm, PROMPT, 20)
    drafter = Scripted(want, len(PROMPT), max_draft=3, hidden_layers=(0, -1))
    llm.reset()
    llm.generate(PROMPT, 20, temperature=0, spec=Speculation(drafter, adaptive=False))
    last = llm.config.num_layers - 1
    assert llm.hidden_layers == (0, last)
    # a reference: every layer output of one pass over the whole sequence
    ref = load(FIXTURES / family, backends=["cpu"], hidden_layers=[0, last], prefill_chunk=0)
    sequence = PROMPT + want
    ref.prefill(sequence)
    rows = {layer: np.concatenate([drafter.prompt_hidden[layer]] + [h[layer] for _, _, h in drafter.received])
            for layer in (0, last)}
    for layer in (0, last):
        assert rows[layer].shape[0] >= len(sequence) - 1
        n = len(sequence) - 1
        np.testing.assert_allclose(rows[layer][:n], ref.hidden(layer, 0, n), atol=2e-4)
    # each accept: n accepted drafts + the target's token, n + 1 hidden rows
    for n, tokens, hidden in drafter.received[1:]:
        assert len(tokens) == n + 1 and all(h.shape[0] == n + 1 for h in hidden.values())


class _OffSometimes(DraftPolicy):
    """Drafting off (plain steps) for the tokens in ``OFF`` of the generation, ``max_draft`` drafts otherwise."""

    OFF = (range(3, 9), range(13, 15))

    def length(self, produced: int) -> int:
        return 0 if any(produced in r for r in self.OFF) else self.max_draft


class _SpeculationOffSometimes(Speculation):
    def _policy(self, previous: DraftPolicy | None = None) -> DraftPolicy:
        return _OffSometimes(self.max_draft, adaptive=False)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_a_drafter_hears_nothing_while_drafting_is_off(family):
    """Steps without a draft call no drafter method; at its next draft the drafter hears every token committed
    meanwhile in one ``accept``, with the hidden rows of the positions before them: the same tokens and rows, in
    order, as when it hears each step (a reference pass over the whole sequence), and plain decoding's output."""
    _backend("cpu")
    llm = load(FIXTURES / family, backends=["cpu"])
    want = _plain(llm, PROMPT, 32)  # 24 generated; a step's tokens past them are committed (and told) too
    drafter = Scripted(want, len(PROMPT), max_draft=3, hidden_layers=(0, -1))
    calls: list[int] = []  # tokens generated at each draft() call
    draft = drafter.draft
    drafter.draft = lambda history, k: calls.append(len(history) - len(PROMPT)) or draft(history, k)
    llm.reset()
    llm.generate(PROMPT, 24, temperature=0, spec=_SpeculationOffSometimes(drafter))
    assert list(llm.last.tokens) == want[:24]
    told = [t for _, tokens, _ in drafter.received for t in tokens]
    assert told == want[:len(told)] and len(told) >= calls[-1]
    assert len(drafter.received) <= 2 * len(calls)  # per draft: what came before it (if anything), what it kept
    batches = [(n, tokens) for n, tokens, _ in drafter.received if len(tokens) > 4]  # drafts are <= 3 tokens
    assert batches and all(n == len(tokens) - 1 for n, tokens in batches)
    last = llm.config.num_layers - 1
    ref = load(FIXTURES / family, backends=["cpu"], hidden_layers=[0, last], prefill_chunk=0)
    sequence = PROMPT + want
    ref.prefill(sequence)
    for layer in (0, last):
        rows = np.concatenate([drafter.prompt_hidden[layer]] + [h[layer] for _, _, h in drafter.received])
        assert rows.shape[0] == len(PROMPT) + len(told) - 1
        np.testing.assert_allclose(rows, ref.hidden(layer, 0, rows.shape[0]), atol=2e-4)


class _PausedSometimes(DraftPolicy):
    """Drafting paused for the tokens in ``OFF`` (their steps run as plain decoding's: ``quiet_steps``),
    ``max_draft`` drafts otherwise."""

    OFF = (range(3, 12), range(15, 27))

    def length(self, produced: int) -> int:
        return 0 if any(produced in r for r in self.OFF) else self.max_draft

    def quiet_steps(self, produced: int) -> int:
        steps = next((r.stop - produced for r in self.OFF if produced in r), 0)
        self.granted = getattr(self, "granted", 0) + steps
        return steps


class _SpeculationPausedSometimes(Speculation):
    def _policy(self, previous: DraftPolicy | None = None) -> DraftPolicy:
        return _PausedSometimes(self.max_draft, adaptive=False)


def _watch_plain_steps(llm) -> list[int]:
    """Counts the model's plain decode steps (``Llm._advance`` after the prompt) in the returned list's length."""
    calls: list[int] = []
    advance = llm._advance

    def watched(owner, ids, *args, **kwargs):
        if len(llm.tokens) == len(ids) - 1:
            calls.append(len(ids))
        return advance(owner, ids, *args, **kwargs)

    llm._advance = watched
    return calls


def _assert_next_step_is_a_fresh_runs(llm, family: str, history: list[int]) -> None:
    """The logits after ``history`` from ``llm``'s cache equal those of a model that only ever saw ``history``
    (a hybrid's recurrent state after rollbacks and plain steps)."""
    fresh = load(FIXTURES / family, backends=["cpu"], prefill_chunk=0)
    fresh.prefill(history[:-1])
    expected = fresh.forward(history[-1:])
    if len(llm.tokens) >= len(history):  # the cache holds more than the history (a step's extra tokens)
        llm.rollback(len(history) - 1)
    got = llm.forward(history[len(llm.tokens):])
    np.testing.assert_allclose(got, expected, atol=2e-4)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "qwen3_5_next"])
def test_steps_of_a_pause_are_plain_decodings_and_drafting_resumes_exactly(family):
    """While drafting is paused the loop runs plain decoding's own steps (``Llm._advance``, one a token); after
    each pause the drafter hears every token of it in one ``accept`` with the rows of their positions, its next
    drafts are verified (some rejected) and the output stays plain greedy decoding's, token for token; a hybrid's
    recurrent state after it is a fresh run's."""
    _backend("cpu")
    llm = load(FIXTURES / family, backends=["cpu"])
    want = _plain(llm, PROMPT, 40)
    drafter = Scripted(want, len(PROMPT), max_draft=3, hidden_layers=(0, -1))
    llm.reset()
    plain_steps = _watch_plain_steps(llm)
    spec = _SpeculationPausedSometimes(drafter)
    llm.generate(PROMPT, 36, temperature=0, spec=spec)
    assert list(llm.last.tokens) == want[:36]
    # every paused token came from a plain step (a pause entered where a step's tokens ended), and no other did
    assert len(plain_steps) == spec.policy.granted >= sum(len(r) for r in _PausedSometimes.OFF) - 2 * 3
    assert llm.stats.verify_steps > 2 and llm.stats.accepted_tokens < llm.stats.drafted_tokens
    told = [t for _, tokens, _ in drafter.received for t in tokens]
    assert told == want[:len(told)] and len(told) >= _PausedSometimes.OFF[-1].stop
    _assert_heard_the_targets_rows(drafter, llm, family, want, len(told))
    _assert_next_step_is_a_fresh_runs(llm, family, PROMPT + list(llm.last.tokens))


def _assert_heard_the_targets_rows(drafter, llm, family: str, want: list[int], told: int) -> None:
    """The hidden rows the drafter received (prompt, then each accepted step's) are the target's own at layers 0
    and last, for the prompt and the first ``told`` tokens of the greedy text ``want``."""
    last = llm.config.num_layers - 1
    ref = load(FIXTURES / family, backends=["cpu"], hidden_layers=[0, last], prefill_chunk=0)
    ref.prefill(PROMPT + want)
    for layer in (0, last):
        rows = np.concatenate([drafter.prompt_hidden[layer]] + [h[layer] for _, _, h in drafter.received])
        assert rows.shape[0] == len(PROMPT) + told - 1
        np.testing.assert_allclose(rows, ref.hidden(layer, 0, rows.shape[0]), atol=2e-4)


class _NeverRight:
    """Drafts a token the target never picks next (its own greedy choice + 1): every draft is rejected."""

    hidden_layers: tuple[int, ...] = ()
    max_draft = 4

    def __init__(self, truth: list[int], prompt_len: int) -> None:
        self.truth, self.prompt_len, self.drafts = truth, prompt_len, 0

    def reset(self) -> None: ...

    def begin(self, prompt, hidden) -> None: ...

    def accept(self, n_accepted, tokens, hidden) -> None: ...

    def draft(self, history, k):
        self.drafts += 1
        return [(self.truth[len(history) - self.prompt_len] + 1) % 320] * k


@pytest.mark.parametrize("family", ["qwen2", "qwen3_5"])
def test_the_adaptive_policy_pauses_a_drafter_never_right_through_plain_steps(family):
    """The real policy switches a drafter that is never right off; the pause's steps go through plain decoding's
    path (recorded at once), the drafter is tried again after it, and the output is plain greedy decoding's."""
    _backend("cpu")
    llm = load(FIXTURES / family, backends=["cpu"])
    want = _plain(llm, PROMPT, 90)
    drafter = _NeverRight(want, len(PROMPT))
    spec = Speculation(drafter)
    llm.reset()
    plain_steps = _watch_plain_steps(llm)  # only the quiet path calls it after the prompt
    llm.generate(PROMPT, 80, temperature=0, spec=spec)
    assert list(llm.last.tokens) == want[:80]
    assert spec.policy.switched_off >= 2 and drafter.drafts >= 2  # paused, tried again, paused again
    assert len(plain_steps) >= 12 and llm.stats.accepted_tokens == 0
    assert spec.policy.runs[1] >= len(plain_steps)  # the quiet steps were recorded
    _assert_next_step_is_a_fresh_runs(llm, family, PROMPT + list(llm.last.tokens))


def test_sampled_decoding_with_drafting_paused_is_plain_sampling_at_the_same_seed():
    """Steps without a draft sample as plain decoding does (the sampler itself, its random draws in the same
    order): a seeded sampled generation whose drafting is off throughout is plain sampling's, token for token."""
    _backend("cpu")
    llm = load(FIXTURES / "qwen3", backends=["cpu"])
    settings = {"temperature": 0.9, "top_k": 40, "seed": 7}
    llm.reset()
    llm.generate(PROMPT, 30, **settings)
    want = list(llm.last.tokens)

    class Off(Speculation):
        def _policy(self, previous=None):
            policy = DraftPolicy(self.max_draft)
            policy.off_until = 10**6
            return policy

    spec = Off(_NeverRight(want + [0] * 40, len(PROMPT)))
    llm.reset()
    plain_steps = _watch_plain_steps(llm)
    llm.generate(PROMPT, 30, spec=spec, **settings)
    assert list(llm.last.tokens) == want
    assert len(plain_steps) > 20 and llm.stats.verify_steps == 0  # most through the quiet path


def test_verify_scores_every_token_of_the_block_as_decode_steps_do():
    _backend("cpu")
    for family in ALL:
        a, b = load(FIXTURES / family, backends=["cpu"]), load(FIXTURES / family, backends=["cpu"])
        a.prefill(PROMPT)
        b.prefill(PROMPT)
        block = [3, 99, 150, 7, 7, 12]
        rows = a.verify(block)
        steps = [b.forward([t])[0] for t in block]
        np.testing.assert_array_equal(rows, np.stack(steps))
    with pytest.raises(HeteroError, match="at most 16 tokens"):
        a.verify(list(range(17)))


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen3_5"])
def test_a_verify_across_a_key_tile_from_an_odd_length_scores_as_decode_steps_do(family):
    """A verify step that starts at an odd cached length and ends past position 64 (the KV cache's key tiles):
    its rows from 64 on were scored without the tile's first keys (0.07-0.9 off in the logits)."""
    _backend("cpu")
    sequence = [int(x) for x in np.random.default_rng(0).integers(0, 300, 140)]
    for start, width in ((61, 4), (63, 2), (125, 5)):
        a, b = load(FIXTURES / family, backends=["cpu"], kv_cache="f16"), load(FIXTURES / family, backends=["cpu"],
                                                                                kv_cache="f16")
        a.prefill(sequence[:start])
        b.prefill(sequence[:start])
        rows = a.verify(sequence[start:start + width])
        steps = [b.forward([t])[0] for t in sequence[start:start + width]]
        np.testing.assert_allclose(rows, np.stack(steps), rtol=0, atol=1e-4)


def test_draft_model_same_tokenizer_accepts_everything(tmp_path):
    _backend("cpu")
    target = load(FIXTURES / "qwen3", backends=["cpu"])
    want = _plain(target, PROMPT, 24)
    drafter = DraftModel(load(FIXTURES / "qwen3", backends=["cpu"]), target, max_draft=4)
    target.reset()
    target.generate(PROMPT, 24, temperature=0, spec=Speculation(drafter, adaptive=False))
    assert list(target.last.tokens) == want
    assert target.stats.accepted_tokens == target.stats.drafted_tokens > 0  # the same model drafts exactly
    # another family with the same tokenizer: drafts mostly rejected, output unchanged; its cache follows along
    other = make_drafter(f"draft:{FIXTURES / 'qwen3_5'}", target)
    target.reset()
    target.generate(PROMPT, 24, temperature=0, spec=Speculation(other, adaptive=False))
    assert list(target.last.tokens) == want


def test_the_next_generation_drafts_from_its_first_step():
    """A Speculation used again (hetero chat's turns, bench repetitions) starts with the step costs of its last
    generation: the first generation takes plain steps until plain decoding's cost is warm, the next drafts at its
    first step; the output stays plain decoding's."""
    _backend("cpu")
    target = load(FIXTURES / "qwen3", backends=["cpu"])
    want = _plain(target, PROMPT, 24)
    firsts: list[int] = []

    class Watched(DraftModel):
        def reset(self) -> None:
            firsts.append(-1)

        def draft(self, history, k):
            if firsts[-1] < 0:
                firsts[-1] = len(history) - len(PROMPT)  # tokens generated before the generation's first draft
            return super().draft(history, k)

    spec = Speculation(Watched(load(FIXTURES / "qwen3", backends=["cpu"]), target, max_draft=4))
    left_off = []
    for _ in range(2):
        target.reset()
        target.generate(PROMPT, 24, temperature=0, spec=spec)
        assert list(target.last.tokens) == want
        left_off.append(spec.policy.off_until - spec.policy.produced)
    # (the prefill's token, then the plain steps until one is warm; the next generation at once, unless drafting
    # was switched off at the end of the last: a draft model as dear as its target (this fixture drafts itself)
    # does not pay, and the tokens left of that pause carry over)
    # (a pause longer than the reply: no draft at all, -1; a trial of this drafter costs dozens of plain steps)
    assert firsts == [1 + COLD_RUNS + 1, max(1, left_off[0]) if left_off[0] < 24 else -1]
    # graded (free) drafts carry plain decoding's cost only (with the widths' costs the lookahead drafted shorter):
    # the next generation asks for drafts from its first step too, its widths timed afresh
    asked: list[int] = []

    class WatchedLookahead(Lookahead):
        def begin(self, prompt, hidden):
            asked.append(-1)
            super().begin(prompt, hidden)

        def draft(self, history, k):
            if asked[-1] < 0:
                asked[-1] = len(history) - len(PROMPT)
            return super().draft(history, k)

    lookahead = Speculation(WatchedLookahead())
    for _ in range(2):
        target.reset()
        target.generate(PROMPT, 24, temperature=0, spec=lookahead)
        policy = lookahead.policy
        assert list(target.last.tokens) == want and policy.steps > 0
        verify_steps = target.stats.verify_steps
    assert asked == [1 + COLD_RUNS + 1, 1]
    assert sum(n for size, n in lookahead.policy.runs.items() if size > 1) == verify_steps  # this generation's only


def test_draft_vocabulary_drafts_the_argmax_over_its_tokens():
    """A draft model loaded with head_rows= (a tied head here: the embedding table stays whole) returns the full
    model's logits of those tokens, drafts their argmax, and the target's output stays plain decoding's."""
    _backend("cpu")
    target = load(FIXTURES / "qwen3", backends=["cpu"])
    want = _plain(target, PROMPT, 24)
    vocab = target.config.vocab_size
    rows = draft_vocabulary(target.tokenizer, vocab, 200)
    assert rows is not None and list(rows) == list(range(200))  # the added tokens (ids 0-4) are among them
    assert draft_vocabulary(target.tokenizer, vocab, 0) is None
    assert draft_vocabulary(target.tokenizer, vocab, vocab) is None
    full = load(FIXTURES / "qwen3", backends=["cpu"])
    sub = load(FIXTURES / "qwen3", backends=["cpu"], head_rows=rows)
    np.testing.assert_allclose(sub.prefill(PROMPT)[-1], full.prefill(PROMPT)[-1][rows], rtol=1e-5, atol=1e-5)
    drafter = DraftModel(sub, target, max_draft=4)
    history = [*PROMPT, *want[:5]]
    reference, drafts = list(history), drafter.draft(history, 4)
    for _ in range(4):
        reference.append(int(rows[np.argmax(full.prefill(reference)[-1][rows])]))
    assert drafts == reference[len(history):]
    # p_min: the draft ends after its first token the draft model is less sure of than p_min
    probs = []
    for i in range(4):
        row = full.prefill(reference[:len(history) + i])[-1][rows].astype(np.float64)
        probs.append(float(np.exp(row.max() - row.max()) / np.exp(row - row.max()).sum()))
    p_min = float(np.median(probs))
    unsure = next(i for i, p in enumerate(probs) if p < p_min)
    assert DraftModel(sub, target, max_draft=4, p_min=p_min).draft(history, 4) == drafts[:unsure + 1]
    target.reset()
    target.generate(PROMPT, 24, temperature=0, spec=Speculation(drafter, adaptive=False))
    assert list(target.last.tokens) == want and target.stats.accepted_tokens > 0
    with pytest.raises(HeteroError, match="loaded with head_rows"):
        sub.generate(PROMPT, 2)
    for bad, why in (([0, 0], "repeated ids"), ([5, vocab], f"id {vocab} is outside"), ([], "empty")):
        with pytest.raises(HeteroError, match=why):
            load(FIXTURES / "qwen3", backends=["cpu"], head_rows=bad)
    assert make_drafter(f"draft:{FIXTURES / 'qwen3'},vocab=256", target).rows is not None
    assert make_drafter(f"draft:{FIXTURES / 'qwen3'},vocab=all", target).rows is None
    options = make_drafter(f"draft:{FIXTURES / 'qwen3'},vocab=all,p_min=0.25,max=9", target)
    assert (options.rows, options.p_min, options.max_draft) == (None, 0.25, 9)
    with pytest.raises(HeteroError, match="max='16'; expected 1 to 15 tokens"):
        make_drafter(f"draft:{FIXTURES / 'qwen3'},max=16", target)
    with pytest.raises(HeteroError, match=r"p_min='1.5'; expected a probability in \[0, 1\)"):
        make_drafter(f"draft:{FIXTURES / 'qwen3'},p_min=1.5", target)
    with pytest.raises(HeteroError, match="vocab='ten'; expected a number of tokens"):
        make_drafter(f"draft:{FIXTURES / 'qwen3'},vocab=ten", target)


def test_requantized_draft_model_rounds_only_wider_matrices(tmp_path, monkeypatch):
    """load(requantize="q4") / "q4_sym_b128" (a draft model's default, ``draft:PATH,quant=q4_sym_b128``): every
    matrix stored in a format of more bits per weight (q8, q5_k, q6_k here; q4_k too for the 128-blocks' 4.125 bits)
    becomes that format within its rounding of the stored values; narrower matrices, the embedding table and the
    other weights stay byte for byte; greedy output drafted by it is plain decoding's."""
    _backend("cpu")
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    path = FIXTURES.parent / "gguf" / "qwen3k-q4_k_m.gguf"
    target = load(path, backends=["cpu"])
    want = _plain(target, PROMPT, 24)
    for spec, block in (("q4", 32), ("q4_sym_b128", 128)):
        small = load(path, backends=["cpu"], requantize=spec)
        assert small.quant.endswith(f">q4_sym_b{block}")
        before, after = target._graph, small._graph
        q4 = weight_format("q4", block, 1)
        seen, rounded_kinds = set(), set()
        for old, new in zip(before.nodes, after.nodes, strict=True):
            assert old.op_type == new.op_type
            if old.op_type != "QMatMul":
                assert old.attrs == new.attrs and old.inputs == new.inputs
                continue
            w_old, w_new = before.initializers[old.inputs[1]], after.initializers[new.inputs[1]]
            fmt = weight_format(**old.attrs)
            seen.add(old.attrs["wtype"])
            if fmt.bits_per_weight <= q4.bits_per_weight:  # q4_k for q4's 32-blocks: as stored
                assert new.attrs == old.attrs and np.array_equal(w_old, w_new)
                continue
            rounded_kinds.add(old.attrs["wtype"])
            assert new.attrs == q4.attrs()
            k = w_old.shape[-1] // fmt.block_bytes * fmt.block_size
            values = dequantize(w_old, fmt, k).reshape(-1, k // block, block)
            rounded = dequantize(w_new, q4, k).reshape(values.shape)
            # q4: d = (the block's value of largest magnitude) / -8 in f16: every value within one step (+ the f16
            # rounding of d, times up to 8 levels) of its own
            step = np.abs(values).max(axis=-1, keepdims=True) / 8 * (1 + 2 ** -7)
            assert np.all(np.abs(rounded - values) <= step + 1e-7)
            assert not np.array_equal(rounded, values)  # really re-rounded
        assert seen >= {"q8", "q5_k", "q6_k", "q4_k"}
        assert rounded_kinds == ({"q8", "q5_k", "q6_k"} if block == 32 else {"q8", "q5_k", "q6_k", "q4_k"}), spec
        for name, array in before.initializers.items():
            if not any(name == n.inputs[1] for n in before.nodes if n.op_type == "QMatMul"):
                assert np.array_equal(after.initializers[name], array), name
    drafter = make_drafter(f"draft:{path}", target)  # the default: quant=q4_sym_b128
    assert drafter.model.quant == small.quant and drafter.max_draft == MAX_DRAFT
    assert make_drafter(f"draft:{path},quant=q4", target).model.quant.endswith(">q4_sym_b32")
    assert make_drafter(f"draft:{path},quant=none", target).model.quant == target.quant
    target.reset()
    target.generate(PROMPT, 24, temperature=0, spec=Speculation(drafter, adaptive=False))
    assert list(target.last.tokens) == want and target.stats.accepted_tokens > 0
    with pytest.raises(HeteroError, match="quant='q3' is not a quantization spec"):
        make_drafter(f"draft:{path},quant=q3", target)


def test_requantized_matrices_are_cached_per_file_format_and_head(tmp_path, monkeypatch):
    """The re-quantized matrices of a GGUF file are written once to $HETERO_CACHE_DIR/requantized and mapped by
    the next load (the same bytes); another head or format is another file; a damaged file is recomputed."""
    _backend("cpu")
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    path = FIXTURES.parent / "gguf" / "qwen3k-q4_k_m.gguf"
    first = load(path, backends=["cpu"], requantize="q4")
    files = sorted((tmp_path / "requantized").iterdir())
    assert len(files) == 1 and files[0].name.startswith("qwen3k-q4_k_m-q4_sym_b32-")
    again = load(path, backends=["cpu"], requantize="q4")
    names = [n.inputs[1] for n in first._graph.nodes if n.op_type == "QMatMul" and n.attrs["wtype"] == "q4"]
    assert names and all(isinstance(again._graph.initializers[n], np.memmap) or
                         isinstance(again._graph.initializers[n].base, np.memmap) for n in names)
    for n in names:
        np.testing.assert_array_equal(again._graph.initializers[n], first._graph.initializers[n])
    np.testing.assert_array_equal(again.prefill(PROMPT), first.prefill(PROMPT))
    load(path, backends=["cpu"], requantize="q4", head_rows=list(range(100)))
    assert len(list((tmp_path / "requantized").iterdir())) == 2
    files[0].write_bytes(files[0].read_bytes()[:100])  # damaged: recomputed (and rewritten)
    third = load(path, backends=["cpu"], requantize="q4")
    np.testing.assert_array_equal(third.prefill(PROMPT), first.prefill(PROMPT))
    assert files[0].stat().st_size > 100


def test_requantize_keeps_a_shared_table_for_its_other_reader():
    """A tied head (the q8 embedding table, read by the Embedding node too) gets a q4 copy; the table stays."""
    _backend("cpu")
    q8 = load(FIXTURES / "qwen3", backends=["cpu"], quant="q8")
    q4 = load(FIXTURES / "qwen3", backends=["cpu"], quant="q8", requantize="q4")
    head_old = next(n for n in q8._graph.nodes if n.name == "logits")
    head_new = next(n for n in q4._graph.nodes if n.name == "logits")
    embed = next(n for n in q4._graph.nodes if n.op_type == "Embedding")
    assert head_old.inputs[1] == embed.inputs[1] != head_new.inputs[1]
    assert embed.attrs["wtype"] == "q8" and head_new.attrs["wtype"] == "q4"
    np.testing.assert_array_equal(q4._graph.initializers[embed.inputs[1]], q8._graph.initializers[embed.inputs[1]])
    assert q4.prefill(PROMPT).shape == q8.prefill(PROMPT).shape


def _watch_steps(model) -> tuple[dict[str, int], list[int]]:
    """Count ``model``'s forward / verify calls, and the tokens each rollback drops."""
    calls, dropped = {"forward": 0, "verify": 0}, []
    run = {name: getattr(model, name) for name in (*calls, "rollback")}

    def forward(ids):
        calls["forward"] += 1
        return run["forward"](ids)

    def verify(ids):
        calls["verify"] += 1
        return run["verify"](ids)

    def rollback(length):
        dropped.append(len(model.tokens) - length)
        run["rollback"](length)

    model.forward, model.verify, model.rollback = forward, verify, rollback
    return calls, dropped


def test_draft_model_lookup_drafts_the_same_tokens_in_fewer_steps():
    """``lookup``: n-gram guesses of the draft model's next tokens, checked by it in one step, keep exactly the
    greedy draft of one token per step (right and wrong guesses, with and without a draft vocabulary and p_min) in
    fewer draft-model steps where the text repeats; the target's output stays plain decoding's."""
    _backend("cpu")
    target = load(FIXTURES / "qwen3", backends=["cpu"])
    want = _plain(target, PROMPT, 40)
    rows = draft_vocabulary(target.tokenizer, target.config.vocab_size, 256)
    for head in (None, rows):
        model = load(FIXTURES / "qwen3", backends=["cpu"], head_rows=head)
        calls, dropped = _watch_steps(model)
        steps = 0
        for p_min in (0.0, 0.3):
            plain, guessed = DraftModel(model, target, lookup=0, p_min=p_min), DraftModel(model, target, p_min=p_min)
            for cut in range(len(PROMPT) + 2, len(PROMPT) + 30, 3):
                history = [*PROMPT, *want][:cut]
                before = dict(calls)
                expected = plain.draft(history, 10)
                single = calls["forward"] - before["forward"]
                before = dict(calls)
                assert guessed.draft(history, 10) == expected, (head is None, p_min, cut)
                steps += single - (calls["forward"] - before["forward"] + calls["verify"] - before["verify"])
        assert calls["verify"] > 0 and steps > 0  # guesses were checked, and they saved draft-model steps
        assert any(dropped) and not all(dropped)  # some guesses were wrong, some right
    drafter = make_drafter(f"draft:{FIXTURES / 'qwen3'}", target)
    assert drafter.lookup is not None and make_drafter(f"draft:{FIXTURES / 'qwen3'},lookup=0", target).lookup is None
    target.reset()
    target.generate(PROMPT, 40, temperature=0, spec=Speculation(drafter, adaptive=False))
    assert list(target.last.tokens) == want
    with pytest.raises(HeteroError, match="lookup='5'; expected 0 \\(off\\) to 4 tokens"):
        make_drafter(f"draft:{FIXTURES / 'qwen3'},lookup=5", target)


def test_draft_model_with_another_vocabulary_is_refused(tmp_path):
    _backend("cpu")
    folder = copy_model("qwen3", tmp_path)
    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[40:42]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (folder / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    target = load(FIXTURES / "qwen3", backends=["cpu"])
    with pytest.raises(HeteroError, match=r"draft model .*qwen3.* and target .*fixtures.*qwen3.* different vocab"):
        make_drafter(f"draft:{folder}", target)


def test_spec_names_and_errors():
    _backend("cpu")
    target = load(FIXTURES / "qwen3", backends=["cpu"])
    assert isinstance(make_drafter("lookahead", target), Lookahead)
    with pytest.raises(HeteroError, match="unknown drafter 'medusa:x'"):
        make_drafter("medusa:x", target)
    flat = make_drafter("lookahead:flat", target)
    assert isinstance(flat, Lookahead) and not flat.graded and make_drafter("lookahead", target).graded
    with pytest.raises(HeteroError, match="takes no argument"):
        make_drafter("lookahead:3", target)
    with pytest.raises(HeteroError, match="needs the draft model's path"):
        make_drafter("draft", target)
    with pytest.raises(HeteroError, match="expected a drafter name"):
        target.generate(PROMPT, 4, spec=42)
    with pytest.raises(HeteroError, match="hidden layer 7 is not a layer"):
        target.expose_hidden([7])


def test_lookahead_drafts_what_followed_the_latest_match():
    la = Lookahead(max_ngram=3, min_ngram=1, graded=False)
    history = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    assert la.draft(history, 4) == [4, 5, 9, 2]  # the longest match first: "1 2 3" was followed by 4 5 9 2
    assert Lookahead(max_ngram=2, min_ngram=1, graded=False).draft(history, 4) == [7, 8, 1, 2]  # "2 3": latest
    la = Lookahead(max_ngram=3, min_ngram=2, graded=False)
    assert la.draft([1, 2, 3, 4, 1, 2, 3], 3) == [4, 1, 2]
    assert la.draft([1, 2, 3, 4, 1, 2, 3, 4, 6], 3) == []  # "4 6" never seen: no draft
    assert la.draft([5, 6, 5, 6], 2) == [5, 6]  # another history: the index starts again
    assert Draft([1]).probs is None and Draft([1]).confidence is None


def test_lookahead_grades_a_draft_by_the_full_length_of_its_match():
    history = [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7]  # the last 8 tokens repeat "1 .. 7" after 9
    got = Lookahead(max_ngram=3).draft(history, 3)
    # found by its last 3 tokens, measured back to the 8 that match (9 1 .. 7): class of 8-15
    assert got == Draft([8, 9, 1], confidence=confidence_class(8)) and confidence_class(8) == 5
    assert Lookahead().draft([4, 7, 5, 7], 2) == Draft([5, 7], confidence=0)  # "7" alone: a match of 1
    assert Lookahead().draft([1, 2, 3], 2) == []  # nothing repeats
    assert [confidence_class(n) for n in (1, 2, 3, 4, 5, 7, 8, 15, 16, 40)] == [0, 1, 2, 3, 4, 4, 5, 5, 6, 6]
    long = list(range(50)) * 2
    assert Lookahead().draft(long, 1).confidence == confidence_class(MAX_MATCH)  # measured up to MAX_MATCH


# a prompt with repeats of several lengths (long, short, none), so drafts of several classes and lengths are cut
MIXED = [*PROMPT, 61, 3, 250, *PROMPT[2:7], 8, 190, 61, 3, 44, 81, 5, 17, 12, 61, 3, 250, 7]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe", "qwen3_5"])
@pytest.mark.parametrize("prompt", [PROMPT * 3, MIXED], ids=["periodic", "mixed"])
def test_graded_lookahead_keeps_greedy_output(family, backend, prompt):
    """The adaptive loop with graded drafts (cut per class by the expected gain, some steps plain) on dense, MoE
    and hybrid fixtures: the output is plain greedy decoding's, token for token."""
    _backend(backend)
    llm = load(FIXTURES / family, backends=[backend], kv_cache="f16")
    want = _plain(llm, prompt, 48)
    spec = Speculation(Lookahead(), max_draft=6)
    assert spec.policy.graded
    llm.reset()
    llm.generate(prompt, 48, temperature=0, spec=spec)
    assert list(llm.last.tokens) == want
    assert llm.stats.verify_steps > 0 and spec.policy.classes


def test_generate_and_bench_commands_with_spec(capsys):
    _backend("cpu")
    from hetero.cli import main

    text = "def f(x): return x + 1\ndef g(x): return x + 1\ndef f(x): return"
    assert main(["generate", str(FIXTURES / "qwen3"), "-p", text, "-n", "24", "--temp", "0", "-b", "cpu"]) == 0
    plain = capsys.readouterr().out
    assert main(["generate", str(FIXTURES / "qwen3"), "-p", text, "-n", "24", "--temp", "0", "-b", "cpu",
                 "--spec", "lookahead", "--spec-draft", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.out == plain
    assert "drafts accepted" in captured.err
    assert main(["bench", "-m", str(FIXTURES / "qwen3"), "--spec", "lookahead", "-n", "8", "-r", "1", "-t", "1",
                 "-c", "1024", "-b", "cpu"]) == 0
    table = capsys.readouterr().out
    assert "| lookahead | code | 8 |" in table and "| lookahead | chat | 8 |" in table and "| NO |" not in table
    # two drafters in the same repetitions: one row each per prompt, each against the same plain runs
    assert main(["bench", "-m", str(FIXTURES / "qwen3"), "--spec", "lookahead:flat", "--spec", "lookahead", "-n", "8",
                 "-r", "2", "-t", "1", "-c", "1024", "-b", "cpu"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "| code |" in line]
    assert [row.split(" | ")[2] for row in rows] == ["lookahead:flat", "lookahead"]
    assert len({row.split(" | ")[5] for row in rows}) == 1 and "| NO |" not in "".join(rows)  # one plain median
    for row in rows:  # the pairs' range: the lowest and highest pair's speed-up, around their median
        cells = row.split(" | ")
        low, high = (float(x) for x in cells[8].rstrip("x").split("-"))
        assert low <= float(cells[7].rstrip("x")) <= high
    assert main(["generate", str(FIXTURES / "qwen3"), "-p", "x", "-n", "2", "--spec", "medusa:/x"]) != 0
    assert "unknown drafter 'medusa:/x'" in capsys.readouterr().err
    for bad in ("0", "16"):  # outside what one verify step scores: refused by name, not clamped in silence
        assert main(["generate", str(FIXTURES / "qwen3"), "-p", "x", "-n", "2", "--spec", "lookahead",
                     "--spec-draft", bad, "-b", "cpu"]) != 0
        assert f"max_draft={bad} (--spec-draft); expected 1..15" in capsys.readouterr().err


def test_step_log_accounts_for_every_step(tmp_path, monkeypatch):
    # HETERO_SPEC_LOG: one line per decode step; the lines of a generation add up to what it produced, and each
    # speculative line's draft and acceptance are the scripted drafter's
    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv("HETERO_SPEC_LOG", str(log))
    llm = load(FIXTURES / "qwen3", backends=["cpu"], kv_cache="f16")
    want = _plain(llm, PROMPT, 24)
    drafter = Scripted(want, len(PROMPT), max_draft=3)
    llm.reset()
    llm.generate(PROMPT, 24, temperature=0, spec=Speculation(drafter, adaptive=False))
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    starts = [i for i, e in enumerate(lines) if e["kind"] == "start"]
    assert [lines[i]["spec"] for i in starts] == [False, True]
    plain, spec = lines[starts[0] + 1:starts[1]], lines[starts[1] + 1:]
    assert [e["kind"] for e in plain] == ["plain"] * 23  # the first token comes from the prompt's prefill
    assert [e["produced"] for e in plain] == list(range(1, 24))
    assert {e["kind"] for e in spec} == {"spec"} and all(0 < e["drafted"] <= 3 for e in spec)
    # what the drafter heard after each step ([0]: the first token, from the prefill)
    assert [(e["accepted"], e["committed"]) for e in spec] == [(n, len(t)) for n, t, _ in drafter.received[1:]]
    assert 1 + sum(e["committed"] for e in spec) >= 24 > 1 + sum(e["committed"] for e in spec[:-1])
    assert all(e["seconds"] > 0 and "plain_cost" in e for e in spec)


def test_a_one_pass_drafter_is_priced_per_drafting_step_and_keeps_greedy_output():
    """``Drafter.one_pass`` (DFlash's block) reaches the policy (its drafts priced by a drafting step's seconds);
    the adaptive loop's output is still plain greedy decoding's."""
    llm = load(FIXTURES / "qwen2", backends=["cpu"], kv_cache="f16")
    want = _plain(llm, PROMPT, 40)
    drafter = Scripted(want, len(PROMPT))
    drafter.one_pass = True
    spec = Speculation(drafter)
    assert spec.policy.one_pass
    llm.reset()
    llm.generate(PROMPT, 40, temperature=0, spec=spec)
    assert list(llm.last.tokens) == want and spec.policy.one_pass


def test_the_speculative_loop_runs_its_drafter_at_one_blas_thread():
    """Spinning OpenBLAS workers after a drafter's numpy matmul took the cores of the next native decode steps
    (hetero.runtime.blas_threads): every drafter call runs with numpy's OpenBLAS at one thread."""
    if not blas_threads():
        pytest.skip("numpy here is not linked to OpenBLAS: no thread count to set")
    _backend("cpu")
    llm = load(FIXTURES / "qwen3", backends=["cpu"])
    counts: list[list[int]] = []

    class Watching:
        hidden_layers = ()
        max_draft = 2

        def reset(self) -> None:
            pass

        def begin(self, prompt, hidden) -> None:
            counts.append(blas_threads())

        def draft(self, history, k):
            counts.append(blas_threads())
            return [history[-1]] * k

        def accept(self, n_accepted, tokens, hidden) -> None:
            counts.append(blas_threads())

    from hetero.runtime import blas_threads as module

    setters, original = [set_ for _, set_ in module._openblas_controls()], blas_threads()
    for set_ in setters:
        set_(2)  # more than one outside, whatever the machine's cores
    try:
        llm.generate(PROMPT, 8, temperature=0, spec=Speculation(Watching(), adaptive=False))
        assert blas_threads() == [2] * len(setters)
    finally:
        for set_, count in zip(setters, original, strict=True):
            set_(count)
    assert len(counts) >= 3 and all(c == [1] * len(setters) for c in counts)


class _ShadowPolicy(DraftPolicy):
    """The real policy on a machine of fixed costs (a plain step 1 s, a verify pass of T tokens 1 + 0.1 (T - 1) s,
    drafting 0.01 s: the tiny fixtures' own microseconds would decide by noise), its trials always in the shadow
    and its pauses ``PAUSE`` tokens (not the backoff's 16, 32, ...: a short generation has several trials),
    starting as a drafter known to lose: three drafting steps, none right, and drafting off. ``shadows``: (tokens
    generated, draft, accepted) of each shadow trial, the draft the last in ``drafts`` (the drafter's:
    ``_ShadowSpeculation``)."""

    PAUSE = 6

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lasting = [0.0, 3.0]
        self._switch_off(0)
        self.shadows: list[tuple[int, list[int], int]] = []
        self.drafts: list[tuple[int, list[int]]] = []

    def _shadow_pays(self) -> bool:
        return True

    def _switch_off(self, produced: int, pause: int = 0) -> None:
        super()._switch_off(produced, pause)
        self.off_until = produced + self.PAUSE

    def record(self, drafted: int, accepted: int, committed: int, seconds: float, produced: int,
               confidence: int | None = None, draft_seconds: float = 0.0) -> None:
        drafting = 0.01 if drafted else 0.0
        super().record(drafted, accepted, committed, 1 + 0.1 * drafted + drafting, produced, confidence, drafting)

    def record_quiet(self, produced: int, steps: int, seconds: float) -> None:
        super().record_quiet(produced, steps, float(steps))

    def record_shadow(self, drafted: int, accepted: int, produced: int, draft_seconds: float,
                      confidence: int | None = None) -> None:
        at, draft = self.drafts[-1]
        self.shadows.append((at, draft[:drafted], accepted))
        super().record_shadow(drafted, accepted, produced, 0.01, confidence)


class _ShadowSpeculation(Speculation):
    """Speculation with ``_ShadowPolicy``, the drafter's drafts logged (tokens generated, draft) for it."""

    def __init__(self, drafter, prompt_length: int = len(PROMPT), **kwargs) -> None:
        self.drafts: list[tuple[int, list[int]]] = []
        draft = drafter.draft

        def logged(history, k):
            proposal = draft(history, k)
            self.drafts.append((len(history) - prompt_length, list(getattr(proposal, "tokens", proposal))))
            return proposal

        drafter.draft = logged
        super().__init__(drafter, **kwargs)

    def _policy(self, previous: DraftPolicy | None = None) -> DraftPolicy:
        policy = _ShadowPolicy(self.max_draft, start=1, graded=bool(getattr(self.drafter, "graded", False)))
        policy.drafts = self.drafts
        return policy


class _ScriptedLogits:
    """A target whose next token after ``history`` is ``script[len(history)]`` (its logits' argmax)."""

    def __init__(self, script: dict[int, int], vocab: int = 16) -> None:
        self.script, self.vocab = script, vocab

    def _advance(self, owner, history):
        row = np.zeros((1, self.vocab), dtype=np.float32)
        row[0, self.script[len(history)]] = 1.0
        return row


def _drain(steps) -> tuple[list[int], int]:
    tokens = []
    try:
        while True:
            tokens.append(next(steps))
    except StopIteration as done:
        return tokens, done.value


def test_a_shadow_trial_scores_its_draft_against_plain_decodings_tokens():
    """Plain decoding goes on through the trial and the draft is scored against what it produces: the tokens up
    to the first that is not the draft's (that one included: the token a verify step would add), or the token
    after a whole draft; the score is the draft's right prefix. Its steps go to the policy as plain ones, also when
    the generation stops amid them."""
    from hetero.llm.sampler import Sampler
    from hetero.llm.speculative.loop import _shadow_trial

    target = _ScriptedLogits({3: 7, 4: 3, 5: 9, 6: 4, 7: 1})
    for draft, tokens, right in (([7, 3, 5], [7, 3, 9], 2), ([7, 3], [7, 3, 9], 2), ([8, 3], [7], 0),
                                 ([7, 3, 9, 4], [7, 3, 9, 4, 1], 4)):
        policy, history = DraftPolicy(4), [1, 2, 3]
        got = _drain(_shadow_trial(target, None, history, Sampler(), policy, 1, draft))
        assert got == (tokens, right) and history == [1, 2, 3, *tokens]
        assert policy.runs[1] == len(tokens) and policy.produced == 1 + len(tokens)
    policy, history = DraftPolicy(4), [1, 2, 3]
    steps = _shadow_trial(target, None, history, Sampler(), policy, 1, [7, 3, 9])
    assert [next(steps), next(steps)] == [7, 3]
    steps.close()  # the generation stopped (EOS, the token limit)
    assert policy.runs[1] == 2 and history == [1, 2, 3, 7, 3]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_shadow_trials_keep_greedy_output_and_tell_the_drafter_what_was_committed(family):
    """Trials in the shadow (a dense and a hybrid model): the output is plain greedy decoding's, token for token;
    each trial's score is its draft's right prefix; the drafter hears every committed token once, in order, with
    the hidden rows of the positions before them (a reference pass over the whole sequence); a hybrid's
    recurrent state after it is a fresh run's."""
    _backend("cpu")
    llm = load(FIXTURES / family, backends=["cpu"])
    want = _plain(llm, PROMPT, 80)  # (qwen3_5's text ends at 62 tokens)
    length = min(64, len(want) - 4)  # past position 64 (a key tile), a step's extra tokens within the text
    drafter = Scripted(want, len(PROMPT), max_draft=3, hidden_layers=(0, -1))
    spec = _ShadowSpeculation(drafter)
    llm.reset()
    llm.generate(PROMPT, length, temperature=0, spec=spec)
    assert list(llm.last.tokens) == want[:length]
    shadows = spec.policy.shadows
    assert len(shadows) >= 2 and any(n == 0 for *_, n in shadows) and any(n > 0 for *_, n in shadows)
    for at, draft, n in shadows:
        assert n == next((i for i, t in enumerate(draft) if t != want[at + i]), len(draft))
    told = [t for _, tokens, _ in drafter.received for t in tokens]
    assert told == want[:len(told)] and length <= len(told) <= length + 4
    _assert_heard_the_targets_rows(drafter, llm, family, want, len(told))
    _assert_next_step_is_a_fresh_runs(llm, family, PROMPT + list(llm.last.tokens))


def test_a_drafter_that_becomes_good_is_resumed_by_a_shadow_trial():
    """The qwen3 fixture's greedy text falls into repeating one token after ~23: a lookahead drafter (ungraded:
    it drafts what followed the latest n-gram match), switched off at the start as one known to lose, is judged in
    the shadow while the text does not repeat, then a shadow trial finds its draft right and drafting resumes:
    verified drafts are accepted from then on, and the output is plain greedy decoding's."""
    _backend("cpu")
    llm = load(FIXTURES / "qwen3", backends=["cpu"])
    want = _plain(llm, PROMPT, 120)
    assert want[30:] == [want[30]] * 90  # the text this test is about
    spec = _ShadowSpeculation(Lookahead(graded=False, max_draft=4))
    llm.reset()
    llm.generate(PROMPT, 120, temperature=0, spec=spec)
    assert list(llm.last.tokens) == want
    shadows = spec.policy.shadows
    assert shadows[0][2] == 0 and shadows[-1][2] == len(shadows[-1][1]) > 0  # wrong at first, then right
    resumed = shadows[-1][0]
    verified = [at for at, _ in spec.drafts if at > resumed]  # the drafts after it (a few empty: no match)
    assert len(verified) >= llm.stats.verify_steps >= 40 and llm.stats.accepted_tokens >= 40
    assert llm.stats.verify_steps > 0 and llm.stats.accepted_tokens > 20


def test_shadow_trials_keep_sampled_output_plain_sampling_at_the_same_seed():
    """A shadow trial draws nothing from the sampler beyond plain decoding's own steps: with a drafter never right
    (every trial in the shadow, drafting never resumed), a seeded sampled generation is plain sampling's, token
    for token, however many trials it had."""
    _backend("cpu")
    llm = load(FIXTURES / "qwen3", backends=["cpu"])
    settings = {"temperature": 0.9, "top_k": 40, "seed": 7}
    llm.reset()
    llm.generate(PROMPT, 60, **settings)
    want = list(llm.last.tokens)
    spec = _ShadowSpeculation(_NeverRight(want + [0] * 40, len(PROMPT)))
    llm.reset()
    llm.generate(PROMPT, 60, spec=spec, **settings)
    assert list(llm.last.tokens) == want
    assert len(spec.policy.shadows) >= 2 and llm.stats.verify_steps == 0


class _SampledDrafts(_NeverRight):
    """Drafts with a distribution q (uniform over two tokens, the first drawn): not one-hot."""

    def draft(self, history, k):
        token = super().draft(history, 1)[0]
        q = np.zeros(320)
        q[[token, (token + 1) % 320]] = 0.5
        return Draft([token], [q])


def test_a_sampled_draft_whose_q_is_not_one_hot_is_verified_not_shadowed():
    """Plain sampling's token equals a draft token x with probability p(x), speculative sampling accepts it with
    min(1, p(x) / q(x)): for a draft not one-hot the match would understate acceptance, so its trial is verified
    (greedy decoding ignores q: its trials stay in the shadow)."""
    _backend("cpu")
    llm = load(FIXTURES / "qwen3", backends=["cpu"])
    want = _plain(llm, PROMPT, 80)
    for settings, shadowed in (({"temperature": 0.9, "seed": 3}, False), ({"temperature": 0}, True)):
        spec = _ShadowSpeculation(_SampledDrafts(want + [0] * 40, len(PROMPT)))
        llm.reset()
        llm.generate(PROMPT, 40, spec=spec, **settings)
        assert bool(spec.policy.shadows) == shadowed and (llm.stats.verify_steps > 0) != shadowed


def test_draft_vocabulary_by_token_counts(tmp_path, monkeypatch):
    """rank=freq / rank=PATH (FR-Spec): the draft vocabulary keeps the most frequent ids (ties: the lower id) and the
    added tokens, ascending; the draft model's token is the argmax over exactly those columns; the corpus counts
    are the tokenizer's and read back from their cache; a bad counts file is a HeteroError naming it."""
    import hetero.llm.speculative.draft_model as dm

    _backend("cpu")
    target = load(FIXTURES / "qwen3", backends=["cpu"])
    vocab = target.config.vocab_size
    added = sorted(target.tokenizer.backend.get_added_tokens_decoder())
    counts = np.zeros(vocab)
    counts[[vocab - 1, 300, 7, 301]] = [5, 9, 9, 1]  # 7 and 300 tie: both kept; then vocab-1, then 301
    rows = draft_vocabulary(target.tokenizer, vocab, 4, counts)
    assert rows is not None and list(rows) == sorted({7, 300, vocab - 1, 301, *added})
    assert list(draft_vocabulary(target.tokenizer, vocab, 3, np.zeros(vocab))) == sorted({0, 1, 2, *added})  # BPE
    # the drafts over a scattered subset: the full model's argmax over those columns, mapped back to ids
    rng = np.random.default_rng(0)
    rows = draft_vocabulary(target.tokenizer, vocab, 300, rng.random(vocab))
    assert rows is not None and rows[-1] > 300 and np.all(np.diff(rows) > 0)
    full = load(FIXTURES / "qwen3", backends=["cpu"])
    sub = load(FIXTURES / "qwen3", backends=["cpu"], head_rows=rows)
    drafter = DraftModel(sub, target, max_draft=5, lookup=0)
    reference = list(PROMPT)
    for _ in range(5):
        reference.append(int(rows[np.argmax(full.prefill(reference)[-1][rows])]))
    assert drafter.draft(list(PROMPT), 5) == reference[len(PROMPT):]
    # the counts of a corpus: the tokenizer's ids counted; the default corpus's cached and read back
    (tmp_path / "a.py").write_text("def f(x):\n    return x + 1\n")
    (tmp_path / "b.py").write_text("print('hello world')\n")
    want = np.bincount(target.tokenizer.encode("def f(x):\n    return x + 1\n", add_special_tokens=False)
                       + target.tokenizer.encode("print('hello world')\n", add_special_tokens=False), minlength=vocab)
    np.testing.assert_array_equal(dm.token_counts(target.tokenizer, vocab, [tmp_path / "a.py", tmp_path / "b.py"]),
                                  want)
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(dm, "CORPUS_BYTES", 20_000)
    first = dm.token_counts(target.tokenizer, vocab)
    (cached,) = (tmp_path / "cache" / "requantized").glob("token-counts-*.npy")
    assert first.sum() > 1000 and np.array_equal(np.load(cached), first)
    np.save(cached, first * 0 + 3)  # what is read back is the file
    assert np.all(dm.token_counts(target.tokenizer, vocab) == 3)
    cached.write_bytes(b"damaged")  # counted again
    np.testing.assert_array_equal(dm.token_counts(target.tokenizer, vocab), first)
    # rank=PATH through --spec; bad files
    good = tmp_path / "counts.npy"
    np.save(good, counts.astype(np.int32))
    made = make_drafter(f"draft:{FIXTURES / 'qwen3'},vocab=256,rank={good}", target)
    assert made.rows is not None and list(made.rows) == list(draft_vocabulary(target.tokenizer, vocab, 256, counts))
    assert make_drafter(f"draft:{FIXTURES / 'qwen3'},vocab=256,rank=freq", target).rows is not None
    for name, data in (("short.npy", np.ones(vocab - 1)), ("negative.npy", -np.ones(vocab)),
                       ("nan.npy", np.full(vocab, np.nan)), ("text.npy", None)):
        bad = tmp_path / name
        if data is None:
            bad.write_text("not numpy")
        else:
            np.save(bad, data)
        with pytest.raises(HeteroError, match=f"draft vocabulary: .*{name}"):
            make_drafter(f"draft:{FIXTURES / 'qwen3'},vocab=256,rank={bad}", target)
    with pytest.raises(HeteroError, match="rank=''; expected bpe, freq"):
        make_drafter(f"draft:{FIXTURES / 'qwen3'},rank=", target)
    monkeypatch.setattr(target, "tokenizer", None)  # a target without a tokenizer has nothing to count with
    with pytest.raises(HeteroError, match="rank=freq counts tokens with the target's tokenizer"):
        make_drafter(f"draft:{FIXTURES / 'qwen3'},vocab=256,rank=freq", target)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_warmed_verify_widths_are_neither_planned_nor_recorded_again(family, monkeypatch):
    """``Speculation.warm`` plans and records each verify width ahead (issue 15: a width's first two runs in a
    process were interpreted, 1-2 plain steps dearer each, charged to the first reply's drafts). After it, a
    generation's verify steps plan and record no shape of 2 .. max_draft + 1 rows, the cached tokens are kept (the
    warm-up ran at the cache's end and rolled back: a hybrid's state too), and the greedy output is plain decoding's."""
    from hetero.llm.families.decoder import INPUT_IDS
    from hetero.runtime.executor import KernelProgram
    from hetero.runtime.replay import Recorder

    llm = load(FIXTURES / family, backends=["cpu"])
    want = _plain(llm, PROMPT, 40)
    spec = Speculation(Scripted(want, len(PROMPT), max_draft=5), adaptive=False)
    llm.reset()
    llm.prefill(PROMPT)
    assert spec.warm(llm) == [1, 2, 3, 4, 5]
    assert llm.tokens == PROMPT
    cold: list[int] = []

    def rows(signature) -> int:
        return next(shape[-1] for name, shape, _ in signature[:len(signature)] if name == INPUT_IDS)

    plan, build = KernelProgram._plan, Recorder.build
    monkeypatch.setattr(KernelProgram, "_plan", lambda self, sig, *a: cold.append(rows(sig)) or plan(self, sig, *a))
    monkeypatch.setattr(Recorder, "build", lambda self, sig, *a: cold.append(rows(sig)) or build(self, sig, *a))
    llm.generate(PROMPT, 40, temperature=0, spec=spec)
    assert list(llm.last.tokens) == want
    assert llm.stats.verify_steps > 0 and llm.stats.drafted_tokens > llm.stats.verify_steps  # widths over 1 ran
    assert not [r for r in cold if 2 <= r <= 6], cold
    spec.warm(llm)  # warming again (each width replayed) changes nothing
    llm.generate(PROMPT, 40, temperature=0, spec=spec)
    assert list(llm.last.tokens) == want


def _watch_native_steps(llm) -> list[tuple[int, list[int], tuple[str, ...]]]:
    """Records each native step of ``llm`` (its position, its token ids, the graph outputs it asks for)."""
    calls: list[tuple[int, list[int], tuple[str, ...]]] = []
    run = llm.session.run

    def watched(feeds, wanted):
        calls.append((int(feeds["past_len"]), [int(i) for i in feeds["input_ids"]], tuple(wanted)))
        return run(feeds, wanted)

    llm.session.run = watched
    return calls


@pytest.mark.parametrize("family", ["qwen2", "qwen3_5"])
def test_an_undrafted_lookahead_step_is_plain_decodings_native_call(family):
    """A step of a lookahead reply that drafts nothing runs the same native call as plain decoding's step at that
    position: one token, the same outputs (no hidden states, no more logits rows). Measured by thread CPU on the
    1.5B at 1 thread (issue 15, chat34b) the two cost the same; this keeps it so."""
    _backend("cpu")
    llm = load(FIXTURES / family, backends=["cpu"])
    llm.reset()
    calls = _watch_native_steps(llm)
    llm.generate(PROMPT, 24, temperature=0)
    want = list(llm.last.tokens)
    plain = {past: (ids, wanted) for past, ids, wanted in calls if len(ids) == 1}
    calls.clear()
    llm.reset()
    llm.generate(PROMPT, 24, temperature=0, spec=Speculation(Lookahead()))
    assert list(llm.last.tokens) == want
    singles = [(past, ids, wanted) for past, ids, wanted in calls if len(ids) == 1 and past >= len(PROMPT)]
    assert singles  # the adaptive policy leaves steps undrafted on this prompt
    for past, ids, wanted in singles:
        assert (ids, wanted) == plain[past], past


def test_the_lookahead_leaves_numpys_blas_threads_alone():
    """The lookahead does no numpy work (``numpy = False``): the loop skips the BLAS thread toggle around it, which
    cost ~10 us a call of its ~0.15 ms of bookkeeping a step (issue 15, chat34b)."""
    if not blas_threads():
        pytest.skip("numpy here is not linked to OpenBLAS: no thread count to set")
    _backend("cpu")
    llm = load(FIXTURES / "qwen3", backends=["cpu"])
    seen: list[list[int]] = []

    class Watched(Lookahead):
        def draft(self, history, k):
            seen.append(blas_threads())
            return super().draft(history, k)

    from hetero.runtime import blas_threads as module

    setters, original = [set_ for _, set_ in module._openblas_controls()], blas_threads()
    for set_ in setters:
        set_(2)
    try:
        llm.generate(PROMPT, 8, temperature=0, spec=Speculation(Watched(), adaptive=False))
        assert seen and all(count == [2] * len(setters) for count in seen)
    finally:
        for set_, count in zip(setters, original, strict=True):
            set_(count)
