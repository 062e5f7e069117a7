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
