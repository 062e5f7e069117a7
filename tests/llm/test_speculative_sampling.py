"""Sampled speculative decoding keeps the target's distribution: chi-square tests of the committed tokens against
the distribution plain sampling draws from, for drafters that sample (q a distribution) and deterministic ones
(q one-hot); the same test rejects the common wrong rule (resampling from p instead of norm(max(0, p - q)))."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import backend_ok
from hetero.llm.sampler import Sampler, SamplingParams
from hetero.llm.speculative import Draft, Speculation
from hetero.llm.speculative.accept import accept, target_probs

from .helpers import FIXTURES, load

P = np.array([0.40, 0.25, 0.15, 0.10, 0.07, 0.03])
Q = np.array([0.10, 0.45, 0.05, 0.30, 0.05, 0.05])  # a drafter that favours the wrong tokens


def chi_square_p(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    """Upper-tail p-value of Pearson's chi-square (Wilson-Hilferty approximation of the chi-square law)."""
    keep = expected_probs > 0
    n = counts.sum()
    expected = n * expected_probs[keep]
    x = float((((counts[keep] - expected) ** 2) / expected).sum())
    if (counts[~keep] > 0).any():
        return 0.0  # a token the target can never produce
    k = int(keep.sum()) - 1
    z = ((x / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _first_tokens(rule, n: int, one_hot: bool, seed: int = 0) -> np.ndarray:
    sampler = Sampler(SamplingParams(temperature=1.0, seed=seed))
    drafter_rng = np.random.default_rng(seed + 1)
    rows = np.log(np.stack([P, P, P]))  # the target's logits at each draft position
    counts = np.zeros(P.size, dtype=np.int64)
    for _ in range(n):
        if one_hot:
            draft = Draft([1, 3])  # a deterministic drafter: always the same guess
        else:
            tokens = drafter_rng.choice(Q.size, size=2, p=Q)
            draft = Draft([int(t) for t in tokens], [Q, Q])
        accepted, token = rule(sampler, rows, draft, [])
        first = draft.tokens[0] if accepted > 0 else token
        counts[first] += 1
    return counts


def _resample_from_p(sampler, rows, draft, history):
    """A wrong rule: accept with min(1, p/q), but on rejection draw from p itself."""
    for i, token in enumerate(draft.tokens):
        p = target_probs(sampler, rows[i], history)
        q = draft.probs[i] if draft.probs is not None else np.eye(p.size)[token]
        if sampler.rng.random() < min(1.0, p[token] / q[token]):
            continue
        return i, int(sampler.rng.choice(p.size, p=p))
    p = target_probs(sampler, rows[len(draft.tokens)], history)
    return len(draft.tokens), int(sampler.rng.choice(p.size, p=p))


@pytest.mark.parametrize("one_hot", [False, True])
def test_accepted_or_resampled_tokens_follow_the_target(one_hot):
    counts = _first_tokens(accept, 5000, one_hot)
    assert chi_square_p(counts, P) > 1e-4, counts
    wrong = _first_tokens(_resample_from_p, 5000, one_hot)
    assert chi_square_p(wrong, P) < 1e-6, wrong  # the test has the power to see a wrong rule


def test_greedy_rows_with_penalties_decide_as_the_sampler():
    sampler = Sampler(SamplingParams(temperature=0, repetition_penalty=2.0))
    rows = np.log(np.stack([P, P]))
    # token 0 is the argmax, but the history penalizes it: the greedy choice is then token 1
    assert accept(sampler, rows, Draft([0]), [0, 0]) == (0, 1)
    # token 1 is then accepted; after it both 0 and 1 are penalized: -1.83 for 0 beats log 0.15 = -1.90 for 2
    assert accept(sampler, rows, Draft([1]), [0]) == (1, 0)


class _SamplingDrafter:
    """Proposes two tokens drawn from a fixed q (the most likely tokens of the target's first position, skewed)."""

    hidden_layers: tuple[int, ...] = ()
    max_draft = 2

    def __init__(self, support: list[int], seed: int) -> None:
        self.q = np.zeros(320)
        self.q[support] = np.array([0.6, 0.3, 0.1])[:len(support)]
        self.q /= self.q.sum()
        self.rng = np.random.default_rng(seed)

    def reset(self) -> None:
        pass

    def begin(self, prompt, hidden) -> None:
        pass

    def accept(self, n_accepted, tokens, hidden) -> None:
        pass

    def draft(self, history, k):
        tokens = [int(t) for t in self.rng.choice(self.q.size, size=k, p=self.q)]
        return Draft(tokens, [self.q] * k)


@pytest.mark.slow
def test_speculative_sampling_on_a_model_keeps_the_pair_distribution():
    """The first two tokens of many seeded generations (top-k 3 keeps the support small) against the exact
    distribution p(t1) p(t2 | t1) computed from the model."""
    if not backend_ok("cpu")[0]:
        pytest.skip(backend_ok("cpu")[1])
    llm = load(FIXTURES / "qwen3", backends=["cpu"])
    params = SamplingParams(temperature=1.0, top_k=3)
    prompt = [5, 17, 300, 2, 9]
    sampler = Sampler(params)
    p1 = target_probs(sampler, llm.prefill(prompt)[-1], prompt)
    firsts = [int(t) for t in np.nonzero(p1)[0]]
    expected = np.zeros((320, 320))
    for t1 in firsts:
        context = [*prompt, t1]
        p2 = target_probs(sampler, llm.prefill(context)[-1], context)
        expected[t1] = p1[t1] * p2
    support = sorted(firsts, key=lambda t: -p1[t])
    counts = np.zeros((320, 320), dtype=np.int64)
    runs, accepted = 1500, 0
    for seed in range(runs):
        spec = Speculation(_SamplingDrafter(support, seed), adaptive=False, max_draft=2)
        llm.generate(prompt, 2, temperature=1.0, top_k=3, seed=seed, spec=spec)
        t1, t2 = llm.last.tokens
        counts[t1, t2] += 1
        accepted += llm.stats.accepted_tokens  # the second token comes from a verify step (the first: the prefill)
    assert chi_square_p(counts.reshape(-1), expected.reshape(-1)) > 1e-4
    assert accepted > runs // 50  # both branches ran: accepted drafts and resampled rejections
