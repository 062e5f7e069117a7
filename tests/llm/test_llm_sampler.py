"""The sampler: greedy, seeded reproducibility, and each filter and penalty on hand-made logits."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.contract import HeteroError
from hetero.llm.sampler import Sampler, SamplingParams, apply_penalties, filtered_probs

LOGITS = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))


def draws(params: SamplingParams, n: int = 400, history=()) -> np.ndarray:
    sampler = Sampler(params)
    return np.array([sampler(LOGITS, history) for _ in range(n)])


def test_greedy():
    assert Sampler()(LOGITS) == 0
    assert Sampler(SamplingParams(temperature=0.0, seed=3))(np.array([0.0, 2.0, 1.0])) == 1


def test_seed_reproducible_and_distinct():
    p = SamplingParams(temperature=1.0, seed=42)
    np.testing.assert_array_equal(draws(p), draws(p))
    assert not np.array_equal(draws(p), draws(SamplingParams(temperature=1.0, seed=43)))


def test_temperature_one_follows_the_distribution():
    counts = np.bincount(draws(SamplingParams(temperature=1.0, seed=0), 4000), minlength=5) / 4000
    np.testing.assert_allclose(counts, np.exp(LOGITS), atol=0.03)


def test_temperature_sharpens_and_flattens():
    cold = filtered_probs(LOGITS, SamplingParams(temperature=0.5))
    hot = filtered_probs(LOGITS, SamplingParams(temperature=2.0))
    assert cold[0] > 0.5 > hot[0]
    np.testing.assert_allclose(cold.sum(), 1) and np.testing.assert_allclose(hot.sum(), 1)


def test_top_k():
    probs = filtered_probs(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    np.testing.assert_allclose(probs, [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0])
    assert set(draws(SamplingParams(temperature=1.0, top_k=2, seed=1))) == {0, 1}


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = filtered_probs(LOGITS, SamplingParams(temperature=1.0, top_p=0.8))
    assert np.count_nonzero(probs) == 3  # 0.5 + 0.2 < 0.8 <= 0.5 + 0.2 + 0.15
    probs = filtered_probs(LOGITS, SamplingParams(temperature=1.0, top_p=0.1))
    np.testing.assert_allclose(probs, [1, 0, 0, 0, 0])


def test_min_p():
    probs = filtered_probs(LOGITS, SamplingParams(temperature=1.0, min_p=0.3))  # keeps p >= 0.15
    assert np.count_nonzero(probs) == 3
    assert set(draws(SamplingParams(temperature=1.0, min_p=0.3, seed=2))) <= {0, 1, 2}


def test_penalties():
    logits = np.array([2.0, -1.0, 0.5, 0.0])
    history = [0, 1, 0, 3]
    rep = apply_penalties(logits, history, SamplingParams(repetition_penalty=2.0))
    np.testing.assert_allclose(rep, [1.0, -2.0, 0.5, 0.0])
    pres = apply_penalties(logits, history, SamplingParams(presence_penalty=0.5))
    np.testing.assert_allclose(pres, [1.5, -1.5, 0.5, -0.5])
    freq = apply_penalties(logits, history, SamplingParams(frequency_penalty=0.5))
    np.testing.assert_allclose(freq, [1.0, -1.5, 0.5, -0.5])
    window = apply_penalties(logits, history, SamplingParams(presence_penalty=1.0, penalty_last_n=2))
    np.testing.assert_allclose(window, [1.0, -1.0, 0.5, -1.0])  # only the last two tokens (0, 3) count
    # a strong repetition penalty changes the greedy choice
    assert Sampler(SamplingParams(repetition_penalty=5.0))(logits, [0]) == 2


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_k=-1), dict(min_p=2),
                                 dict(repetition_penalty=0)])
def test_invalid_params(bad):
    with pytest.raises(HeteroError):
        SamplingParams(**bad)


def test_greedy_fast_path_picks_what_the_general_path_picks():
    """Greedy with only a logit bias skips the float64 copy: the same token as the general path (penalties made
    neutral force it) on ties, biases that overtake or sink the maximum, and non-finite logits."""
    rng = np.random.default_rng(3)
    general = SamplingParams(temperature=0.0, presence_penalty=1e-300)  # a no-op penalty: the general path
    cases = [rng.standard_normal(50).astype(np.float32) for _ in range(200)]
    tie = np.zeros(50, np.float32)
    tie[[7, 30]] = 2.0
    cases += [tie, np.full(50, -np.inf, np.float32), np.where(np.arange(50) == 9, np.nan, 0).astype(np.float32)]
    inf = np.zeros(50, np.float32)
    inf[12] = np.inf
    cases.append(inf)
    for i, logits in enumerate(cases):
        bias = {int(b): float(v) for b, v in zip(rng.integers(0, 55, 3), rng.choice([-100.0, 0.5, 3.0, 100.0], 3),
                                                 strict=True)}
        if i == 200:
            bias = {30: 0.0, 40: 2.0}  # ties: the first of the maxima
        fast, slow = Sampler(SamplingParams(temperature=0.0), logit_bias=bias), Sampler(general, logit_bias=bias)
        assert fast._plain_greedy and not slow._plain_greedy
        try:
            want = slow(logits, [1])
        except HeteroError:
            with pytest.raises(HeteroError):
                fast(logits, [1])
            continue
        assert fast(logits, [1]) == want, (i, bias)
