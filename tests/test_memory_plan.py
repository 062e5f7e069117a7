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


def test_values_within_another_take_its_place_and_widen_its_lifetime():
    # a Concat's output (c, steps 3-5) holding its inputs a (step 1) and b (step 2): they take no place of their own,
    # c is placed for steps 1-5, and a value alive at step 1 (x) does not overlap any of them
    lifetimes = [Lifetime("x", 4096, 0, 1), Lifetime("a", 1024, 1, 3), Lifetime("b", 2048, 2, 3),
                 Lifetime("c", 3072, 3, 5), Lifetime("y", 512, 4, 5)]
    plan = plan_arena(lifetimes, within={"a": ("c", 0), "b": ("c", 1024)})
    c = plan.offsets["c"]
    assert plan.offsets["a"] == c and plan.offsets["b"] == c + 1024
    assert plan.sizes["a"] == 1024 and plan.sizes["b"] == 2048
    x, y = plan.offsets["x"], plan.offsets["y"]
    assert x + 4096 <= c or c + 3072 <= x  # x is alive at step 1, when a is written into c
    assert y + 512 <= c or c + 3072 <= y
    assert plan.unshared_bytes == 4096 + 1024 + 2048 + 3072 + 512


def test_host_arena_starts_on_a_cache_line():
    # the planner's offsets are multiples of ALIGN; they are cache-line aligned in memory only if the arena's start is
    # (numpy's own buffers start 16 bytes into a line: kernels splitting an output by columns then shared its lines)
    import numpy as np

    from hetero.contract.backend import HostMemory

    class Host(HostMemory):
        name = "host"

    host = Host.__new__(Host)
    for nbytes in (1, 100, 4096, 1 << 20, (1 << 20) + 17):
        arena = host.alloc(nbytes, "arena")
        assert arena.nbytes == nbytes and arena.dtype == np.uint8
        assert arena.ctypes.data % host.arena_align == 0
        arena[:] = 7  # writable, and the whole of it is there
