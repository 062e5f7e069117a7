"""The adaptive draft length: it follows measured step costs and acceptance, and switches drafting off when it
does not pay (fed with step costs directly: the policy decides from numbers, whatever machine they came from)."""

from __future__ import annotations

import pytest

from hetero.llm.speculative.policy import COLD_RUNS, MIN_SPEC_STEPS, DraftPolicy, expected_tokens


def _run(policy: DraftPolicy, steps: int, cost, accept, cold: float = 1.0) -> list[int]:
    """Drive the policy: a step of T tokens takes cost(T) seconds (x ``cold`` for the first COLD_RUNS of each
    size: the executor plans and records a new shape); accept(k) drafts of k are kept."""
    produced, lengths, runs = 0, [], {}
    for _ in range(steps):
        k = policy.length(produced)
        lengths.append(k)
        kept = accept(k) if k else 0
        committed = kept + 1
        runs[k] = runs.get(k, 0) + 1
        policy.record(k, kept, committed, cost(k + 1) * (cold if runs[k] <= COLD_RUNS else 1.0), produced)
        produced += committed
    return lengths


def test_expected_tokens():
    assert expected_tokens(0.0, 5) == 1
    assert expected_tokens(1.0, 5) == 6
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_always_right_and_cheap_steps_draft_long():
    policy = DraftPolicy(8)
    lengths = _run(policy, 40, cost=lambda t: 1 + 0.05 * (t - 1), accept=lambda k: k)
    assert lengths[:COLD_RUNS + 1] == [0] * (COLD_RUNS + 1)  # plain decoding measured first, until warm
    assert max(lengths) == 8 and policy.switched_off == 0


def test_cold_steps_neither_switch_drafting_off_nor_price_plain_decoding():
    # the first steps of each size run 3x slower (planning, recording): judged on them, drafting would look like a
    # loss (switched off) and plain decoding too dear (drafting kept where it loses); warm costs decide instead
    paying = DraftPolicy(4)
    _run(paying, 40, cost=lambda t: 1 + 0.1 * (t - 1), accept=lambda k: k, cold=3.0)
    assert paying.switched_off == 0 and paying.plain_cost == 1.0
    losing = DraftPolicy(4)
    lengths = _run(losing, 80, cost=lambda t: 1 + 0.5 * (t - 1), accept=lambda k: 0, cold=3.0)
    assert losing.switched_off >= 1 and lengths[-30:].count(0) >= 25


def test_never_right_switches_drafting_off():
    policy = DraftPolicy(8)
    lengths = _run(policy, 60, cost=lambda t: 1 + 0.3 * (t - 1), accept=lambda k: 0)
    assert policy.switched_off >= 1
    assert lengths[-20:].count(0) >= 15  # mostly plain steps once it saw drafting lose


def test_expensive_steps_keep_drafts_short():
    # each extra token costs 0.8 of a step: with 60% acceptance only one draft token is worth scoring
    policy = DraftPolicy(8)
    seen = iter(range(10_000))
    lengths = _run(policy, 40, cost=lambda t: 1 + 0.8 * (t - 1),
                   accept=lambda k: sum(1 for _ in range(k) if next(seen) % 5 < 3))
    drafted = [k for k in lengths[MIN_SPEC_STEPS + 2:] if k]
    assert drafted and max(drafted) <= 2


def test_fixed_length_when_not_adaptive():
    policy = DraftPolicy(5, adaptive=False, start=5)
    assert set(_run(policy, 10, cost=lambda t: 1.0, accept=lambda k: 0)) == {5}
