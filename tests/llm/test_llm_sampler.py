"""The sampler: greedy, seeded reproducibility, and each filter and penalty on hand-made logits."""

from __future__ import annotations

import numpy as np
import pytest

from concurrency import run_in_threads
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


def _random_case(rng: np.random.Generator, size: int) -> tuple[np.ndarray, SamplingParams]:
    scale = float(rng.choice([0.1, 1.0, 5.0, 50.0, 400.0]))  # 400: most exps underflow to 0
    x = rng.standard_normal(size) * scale
    if rng.random() < 0.3:
        x = np.round(x)  # ties, at the top-k / top-p / min-p cuts too
    if rng.random() < 0.2 and size > 3:
        x[rng.integers(0, size, 3)] = -np.inf  # a grammar's mask
    params = SamplingParams(temperature=float(rng.choice([0.01, 0.5, 0.8, 1.0, 2.0])),
                            top_k=int(rng.choice([0, 1, 5, 40, 10**6])),
                            top_p=float(rng.choice([1.0, 0.95, 0.5, 0.999999, 1e-9])),
                            min_p=float(rng.choice([0.0, 0.05, 0.5, 1.0])), seed=int(rng.integers(1 << 30)))
    return x, params


def test_filtered_probs_bit_identical_to_the_full_vocabulary_definition():
    """The filters on the kept ids only (``_filtered``) give the whole-vocabulary definition's probabilities bit for
    bit -- ties at the cuts, -inf logits, sizes from 1, a 152k vocabulary -- and NaN / +inf logits take its path."""
    from hetero.llm.sampler import _filtered, _full_filtered_probs

    rng = np.random.default_rng(5)
    for trial in range(300):
        size = 151_936 if trial % 50 == 0 else int(rng.choice([1, 2, 7, 50, 1000, 3000]))
        x, params = _random_case(rng, size)
        want = _full_filtered_probs(x, params)
        got, support = _filtered(x, params)
        assert np.array_equal(got.view(np.int64), want.view(np.int64)), (size, params)
        if support is not None:  # every positive probability lies in the support
            outside = np.ones(size, dtype=bool)
            outside[support] = False
            assert not got[outside].any()
    for bad in (np.nan, np.inf):
        x = np.array([0.0, 1.0, bad, 2.0])
        for params in (SamplingParams(temperature=1.0, top_k=2, top_p=0.9), SamplingParams(temperature=1.0)):
            with np.errstate(invalid="ignore"):  # inf - inf: the full path's NaN, as before
                want = _full_filtered_probs(x, params)
                got = filtered_probs(x, params)
            assert np.array_equal(np.isnan(got), np.isnan(want))
            assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def test_sampled_tokens_unchanged_for_a_fixed_seed():
    """A seeded sampler draws the tokens ``rng.choice`` draws from the whole vocabulary's probabilities (the draw
    over the support uses the same one uniform number per token)."""
    from hetero.llm.sampler import _full_filtered_probs

    rng = np.random.default_rng(9)
    for trial in range(60):
        x, params = _random_case(rng, 151_936 if trial % 20 == 0 else int(rng.choice([2, 50, 3000])))
        if params.greedy:
            continue
        sampler = Sampler(params)
        reference = np.random.default_rng(params.seed)
        want = _full_filtered_probs(x, params)
        for _ in range(25):
            assert sampler(x) == int(reference.choice(want.size, p=want)), params


def test_seeded_generation_from_two_threads_on_two_models_draws_the_full_paths_tokens(monkeypatch):
    """Two models generating with seeded top-k / top-p / min-p sampling in two threads at once produce, each, the
    tokens of a generation drawn with ``rng.choice`` over the whole vocabulary's probabilities (base's path)."""
    import hetero.llm.sampler as sampler_module

    from .helpers import FIXTURES, load

    models = [load(FIXTURES / "qwen3"), load(FIXTURES / "qwen3")]
    runs = [([1, 2, 3, 4, 5], {"temperature": 0.9, "top_k": 40, "top_p": 0.9, "min_p": 0.02, "seed": 11}),
            ([9, 8, 7], {"temperature": 1.3, "top_p": 0.8, "seed": 4})]

    def generate(i: int) -> list[int]:
        prompt, options = runs[i]
        models[i].reset()
        models[i].generate(prompt, max_new_tokens=24, **options)
        return list(models[i].last.tokens)

    with monkeypatch.context() as patch:
        patch.setattr(sampler_module, "_filtered",
                      lambda x, p: (sampler_module._full_filtered_probs(x, p), None))
        want = [generate(0), generate(1)]

    def run(i: int) -> list[list[int]]:
        return [generate(i) for _ in range(3)]

    assert run_in_threads(run, 2) == [[want[0]] * 3, [want[1]] * 3]
    assert all(len(tokens) > 4 for tokens in want)  # long enough to have sampled more than a token or two
