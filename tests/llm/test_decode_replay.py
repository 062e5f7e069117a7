"""The replayed decode step (feeds copied into the replay's buffers, kernels as bound native calls) computes what
the interpreter computes, checks what ``run`` checks, and stays visible to the decode profiler."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import backend_ok
from hetero.contract import HeteroError
from hetero.llm.model import PAST_LEN
from hetero.llm.profile import profile_decode
from hetero.llm.synthetic import load_synthetic

pytestmark = pytest.mark.skipif(not backend_ok("cpu")[0], reason="the cpu plugin is not built")

BOUND_OPS = {"QMatMul", "Embedding", "RMSNorm", "RotaryEmbedding", "Attention", "SwiGLU", "Add"}


def _tiny(**kw):
    return load_synthetic("tiny", "q4", backends=["cpu"], on_fallback="silent", context=64, progress=False, **kw)


def _decode(llm, prompt, tokens):
    llm.reset()
    llm.prefill(prompt)
    return [llm.forward([t]).copy() for t in tokens]


def test_replayed_decode_matches_the_interpreter():
    prompt, tokens = [5, 17, 300, 2], [7, 7, 411, 3, 90, 12, 255, 1]
    replayed, interpreted = _tiny(), _tiny()
    interpreted.session.programs[0].replayable = False  # every step through the interpreter
    got, want = _decode(replayed, prompt, tokens), _decode(interpreted, prompt, tokens)
    replay = replayed.session.programs[0].replay
    assert replay is not None and interpreted.session.programs[0].replay is None
    # every LLM kernel and residual Add of the step is a bound call, the LM head too (it writes into the arena: the
    # graph output is the Slice of the last rows after it)
    bindable = sum(node.op_type in BOUND_OPS for node, _ in replayed.session.kernels())
    assert replay.bound >= bindable
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    # the returned logits are the caller's: a later step does not overwrite them
    assert not np.shares_memory(got[-1], got[-2])


def test_greedy_hint_is_the_argmax_of_each_steps_logits(monkeypatch):
    """The LM head's second output (the cpu plugin's llm_matmul_argmax): each one-row step's argmax, interpreted
    (the first runs) and replayed, equal to numpy's on the logits the step returned; the logits and the greedy
    tokens equal a model loaded without it; a row of another step, or part of a row, gets no hint."""
    import hetero.llm.model as model

    llm = _tiny()
    assert llm._greedy == "greedy"
    monkeypatch.setattr(model, "_cpu_first", lambda backends: False)
    plain = _tiny()
    assert plain._greedy is None and plain.greedy_hint(np.zeros(3, np.float32)) is None
    prompt, tokens = [5, 17, 300, 2], [7, 7, 411, 3, 90, 12, 255, 1]
    rows = llm.prefill(prompt)
    assert llm.greedy_hint(rows[-1]) == int(np.argmax(rows[-1]))  # a several-row step's rows too
    previous = None
    for t in tokens:
        logits = llm.forward([t])
        assert llm.greedy_hint(logits[-1]) == int(np.argmax(logits[-1]))
        assert llm.greedy_hint(logits[0, :5]) is None  # not a whole row
        if previous is not None:
            assert llm.greedy_hint(previous[-1]) is None  # the step before's
        previous = logits
    for a, b in zip(_decode(llm, prompt, tokens), _decode(plain, prompt, tokens), strict=True):
        np.testing.assert_array_equal(a, b)
    for text_prompt in ([1, 2, 3], [400, 9, 9, 9, 31], [11]):
        a = llm.generate(text_prompt, max_new_tokens=12, temperature=0)
        b = plain.generate(text_prompt, max_new_tokens=12, temperature=0)
        assert a == b and llm.last.tokens == plain.last.tokens


def _record_hints(monkeypatch) -> list[int | None]:
    """Sampler.sample spied on: the argmax hint of each call, in order, each checked against np.argmax of its row."""
    from hetero.llm.sampler import Sampler

    seen: list[int | None] = []
    sample = Sampler.sample

    def spy(self, logits, history=(), argmax=None):
        seen.append(argmax)
        if argmax is not None:
            assert argmax == int(np.argmax(logits))
        return sample(self, logits, history, argmax)

    monkeypatch.setattr(Sampler, "sample", spy)
    return seen


def test_greedy_hint_feeds_the_sampler_only_when_greedy(monkeypatch):
    """generate passes the step's argmax to a plain greedy sampler (and the tokens are those of np.argmax), and
    never to one that needs the logits (penalties, sampling)."""
    seen = _record_hints(monkeypatch)
    llm = _tiny()
    llm.generate([1, 2, 3], max_new_tokens=8, temperature=0)
    assert all(h is not None for h in seen) and len(seen) == 8  # the first: the prefill's last row
    seen.clear()
    llm.generate([1, 2, 3], max_new_tokens=8, temperature=0, repetition_penalty=1.3)
    assert seen and all(h is None for h in seen)
    seen.clear()
    llm.generate([1, 2, 3], max_new_tokens=8, temperature=0.8, seed=1)
    assert seen and all(h is None for h in seen)


def test_replayed_step_checks_past_len_like_run():
    llm = _tiny()
    _decode(llm, [1, 2, 3], [4, 5, 6])
    assert llm.session.programs[0].replay is not None
    ids = np.array([9], dtype=np.int64)
    with pytest.raises(HeteroError, match=r"past_len 40 is outside the 6 cached positions"):
        llm.session.run({"input_ids": ids, PAST_LEN: np.asarray(40, dtype=np.int64)})
    _decode(llm, list(range(61)), [4, 5, 6])  # the cache is full
    with pytest.raises(HeteroError, match=r"64 cached \+ 1 new tokens exceed the context of 64 tokens"):
        llm.session.run({"input_ids": ids, PAST_LEN: np.asarray(64, dtype=np.int64)})


def test_token_out_of_range_in_a_replayed_step():
    llm = _tiny()
    _decode(llm, [1, 2, 3], [4, 5])
    with pytest.raises(HeteroError, match="embed"):
        llm.session.run({"input_ids": np.array([100_000], dtype=np.int64), PAST_LEN: np.asarray(5, np.int64)})


def test_profiler_times_the_bound_calls():
    llm = _tiny()
    result = profile_decode(llm, steps=4, prompt=4, warmup=2, rounds=2)
    ops = {op.op: op for op in result.ops}
    assert set(ops) >= BOUND_OPS
    layers = llm.config.num_layers
    assert ops["QMatMul"].calls == ops["QMatMul"].native_calls == 7 * layers + 1
    assert ops["Attention"].native_calls == layers and ops["RotaryEmbedding"].native_calls == 2 * layers
    assert result.native_us > 0
    replay = llm.session.programs[0].replay
    assert replay is None or replay.bound > 0  # the wrappers were taken off again


def test_profiler_cpu_clock_and_its_argument_check():
    llm = _tiny()
    result = profile_decode(llm, steps=4, prompt=4, warmup=2, rounds=2, clock="cpu")
    assert result.clock == "cpu" and result.step_us > 0 and 0 <= result.outside_pct <= 100
    assert "CPU time" in result.markdown()
    with pytest.raises(HeteroError, match="clock='gpu'"):
        profile_decode(llm, steps=4, prompt=4, warmup=2, clock="gpu")


def test_profiler_verify_steps_of_a_width():
    """width > 1: every profiled step is a verify of that many tokens right after the prompt (the cache rolled back
    to it between steps), with the decode step's calls."""
    llm = _tiny()
    seen: list[tuple[int, int]] = []  # (cached tokens, tokens verified) per verify
    verify = llm.verify

    def counted(ids):
        seen.append((len(llm.tokens), len(ids)))
        return verify(ids)

    llm.verify = counted
    result = profile_decode(llm, steps=4, prompt=4, warmup=2, rounds=2, width=3)
    assert seen and set(seen) == {(4, 3)}
    ops = {op.op: op for op in result.ops}
    assert ops["QMatMul"].native_calls == 7 * llm.config.num_layers + 1
    assert result.step_us > 0 and len(llm.tokens) == 0


def test_verify_rows_get_the_lm_heads_argmax_and_greedy_speculation_uses_it(monkeypatch):
    """Every row of a verify step (k + 1 rows) has its argmax from the LM head's call, numpy's; greedy speculative
    decoding passes it to the sampler for each row it accepts by (and for plain steps between), never to a sampler
    that needs the logits, and its tokens equal plain decoding's and those of the same run without the hint."""
    from hetero.llm.model import Llm
    from hetero.llm.speculative import Lookahead, Speculation

    llm = _tiny()
    llm.prefill([5, 17, 300, 2])
    rows = llm.verify([7, 411, 3, 90, 12])
    assert [llm.greedy_hint(row) for row in rows] == [int(np.argmax(row)) for row in rows]
    assert llm.greedy_hint(rows[2, 1:]) is None

    seen = _record_hints(monkeypatch)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]  # repeats: the lookahead drafts
    want = llm.generate(prompt, max_new_tokens=24, temperature=0)
    seen.clear()
    got = llm.generate(prompt, max_new_tokens=24, temperature=0, spec=Speculation(Lookahead(min_ngram=1),
                                                                                  adaptive=False))
    assert got == want and llm.stats.verify_steps > 0
    assert len(seen) >= 24 and all(h is not None for h in seen)  # the prefill's row, each verify row it read
    monkeypatch.setattr(Llm, "greedy_hint", lambda self, row: None)
    assert llm.generate(prompt, max_new_tokens=24, temperature=0,
                        spec=Speculation(Lookahead(min_ngram=1), adaptive=False)) == want
    monkeypatch.undo()
    seen = _record_hints(monkeypatch)
    llm.generate(prompt, max_new_tokens=12, temperature=0, repetition_penalty=1.3,
                 spec=Speculation(Lookahead(min_ngram=1), adaptive=False))
    assert seen and all(h is None for h in seen)
