"""The arena planner: live values never overlap, dead ones are reused."""

from __future__ import annotations

import itertools
import random

from hetero.runtime.memory import ALIGN, Lifetime, plan_arena


def _check_no_overlap(lifetimes: list[Lifetime]) -> None:
    plan = plan_arena(lifetimes)
    for a, b in itertools.combinations(lifetimes, 2):
        if a.first <= b.last and b.first <= a.last:  # alive at the same time
            a0, b0 = plan.offsets[a.name], plan.offsets[b.name]
            assert a0 + a.nbytes <= b0 or b0 + b.nbytes <= a0, (a, b, plan.offsets)
    for life in lifetimes:
        assert plan.offsets[life.name] % ALIGN == 0
        assert plan.offsets[life.name] + life.nbytes <= plan.arena_bytes


def test_chain_reuses_two_buffers():
    chain = [Lifetime(f"v{i}", 1024, i, i + 1) for i in range(10)]
    plan = plan_arena(chain)
    assert plan.arena_bytes == 2 * 1024
    assert plan.unshared_bytes == 10 * 1024
    assert "80% saved" in plan.describe()


def test_random_lifetimes_never_overlap():
    rng = random.Random(0)
    for _ in range(50):
        lifetimes = []
        for i in range(rng.randint(1, 40)):
            first = rng.randint(0, 30)
            lifetimes.append(Lifetime(f"v{i}", rng.randint(1, 5000), first, first + rng.randint(0, 10)))
        _check_no_overlap(lifetimes)
