"""A small convolution does not wake a sleeping pool worker (waking one costs more than the work), a large one does,
and which of the two ran it changes no bit of the result."""

from __future__ import annotations

import time

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)
from onnx import TensorProto, helper  # noqa: E402

import hetero  # noqa: E402
from conftest import make_model  # noqa: E402


def _conv(channels: int, size: int):
    rng = np.random.default_rng(channels)
    w = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                       [("x", TensorProto.FLOAT, [1, channels, size, size])], [("y", TensorProto.FLOAT, None)],
                       [("w", w)])
    x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
    return model, {"x": x}


def _run_after_the_workers_sleep(session, feeds, wakes: bool):
    """Runs ``session`` once the pool's workers (spin 0) have had time to fall asleep; returns whether the run made a
    pool call, and its outputs. On a busy machine a worker may reach its sleep late, so a run that met it still awake
    is tried again (up to ~2 s) where the expected answer is "no wake": a kernel that wakes sleepers fails every try."""
    for _ in range(40 if not wakes else 1):
        time.sleep(0.05)  # let the workers fall asleep
        _native.pool_stats(True)
        out = session.run(feeds)
        woke = _native.pool_stats(True)["calls"] >= 1
        if woke == wakes:
            break
    return woke, out


@pytest.mark.parametrize("channels, size, wakes", [(16, 16, False), (64, 32, True)])  # 1.2 / 75 MFLOP
def test_a_worker_is_woken_only_for_enough_work(pool, channels, size, wakes):
    _native.set_pool_spin_us(0)  # workers sleep as soon as a call ends (the fixture restores the spin)
    _native.set_pool_linger_us(0)  # and after a replayed run (its end would wake them: a late one could meet the call)
    model, feeds = _conv(channels, size)
    alone = hetero.Session(model, backends=["cpu"], threads=1).run(feeds)["y"]
    session = hetero.Session(model, backends=["cpu"], threads=2)
    session.run(feeds)
    woke, out = _run_after_the_workers_sleep(session, feeds, wakes)
    assert woke == wakes
    assert np.array_equal(out["y"], alone)


def _one_node(op: str, shape: list[int], **attrs):
    outs = ["y", "y_scale", "y_zero_point"] if op == "DynamicQuantizeLinear" else ["y"]
    ys = [(name, TensorProto.UINT8 if name != "y_scale" and op == "DynamicQuantizeLinear" else TensorProto.FLOAT,
           None) for name in outs]
    model = make_model([helper.make_node(op, ["x"], outs, **attrs)], [("x", TensorProto.FLOAT, shape)], ys)
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    return model, {"x": x}


def _mul(shape: list[int]):
    model = make_model([helper.make_node("Mul", ["x", "x"], ["y"])], [("x", TensorProto.FLOAT, shape)],
                       [("y", TensorProto.FLOAT, None)])
    return model, {"x": np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)}


# The elementwise and row kernels (elementwise.cpp) and DynamicQuantizeLinear (qlinear.cpp) split work of two threads'
# grain or more, but wake a sleeping worker only from kWakeElementWork (common.hpp) on: the small shapes below go
# parallel while a worker spins and run on the caller while it sleeps (T5-encoder sized: 70 x 512 / 70 x 1024).
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("make, shape, wakes", [
    (_mul, [70, 1024], False), (_mul, [512, 1024], True),
    (lambda s: _one_node("Softmax", s, axis=-1), [70, 512], False),
    (lambda s: _one_node("Softmax", s, axis=-1), [512, 512], True),
    (lambda s: _one_node("Tanh", s), [70, 512], False), (lambda s: _one_node("Tanh", s), [512, 512], True),
    (lambda s: _one_node("DynamicQuantizeLinear", s), [400, 500], False),
    (lambda s: _one_node("DynamicQuantizeLinear", s), [512, 1024], True),
], ids=["mul-small", "mul-large", "softmax-small", "softmax-large", "tanh-small", "tanh-large", "dql-small",
        "dql-large"])
def test_elementwise_kernels_wake_only_for_enough_work(pool, threads, make, shape, wakes):
    _native.set_pool_linger_us(0)  # workers asleep after a replayed run too (see above)
    model, feeds = make(shape)
    alone = hetero.Session(model, backends=["cpu"], threads=1).run(feeds)
    session = hetero.Session(model, backends=["cpu"], threads=threads)
    session.run(feeds)
    _native.set_pool_spin_us(1_000_000)  # awake: the call goes parallel
    for _ in range(100):  # a woken worker may take a while to be scheduled on a busy machine
        _native._pool_cover(64, threads, 20)  # wakes the workers (a plain parallel_for), which then spin
        time.sleep(0.01)
        _native.pool_stats(True)
        spun = session.run(feeds)
        if _native.pool_stats(True)["calls"] >= 1:
            break
    else:
        pytest.fail("the call never went parallel while the workers spun")
    _native.set_pool_spin_us(0)
    session.run(feeds)
    woke, slept = _run_after_the_workers_sleep(session, feeds, wakes)
    assert woke == wakes
    for name, want in alone.items():
        assert np.array_equal(spun[name], want), name
        assert np.array_equal(slept[name], want), name



def _small_conv_probe(linger_us: int):
    """Workers that sleep as soon as a call ends (spin 0) unless a linger (``linger_us``) keeps them spinning, and a
    1.2 MFLOP conv that never wakes a sleeper: its feeds, its 1-thread output and a 2-thread session of it."""
    _native.set_pool_spin_us(0)
    _native.set_pool_linger_us(linger_us)
    small, feeds = _conv(16, 16)
    alone = hetero.Session(small, backends=["cpu"], threads=1).run(feeds)["y"]
    return feeds, alone, hetero.Session(small, backends=["cpu"], threads=2)


def _assert_probe_ran(probe, feeds, alone, parallel: bool) -> None:
    """The probe's run made a pool call exactly when ``parallel``, and gave the 1-thread output."""
    _native.pool_stats(True)
    out = probe.run(feeds)["y"]
    stats = _native.pool_stats(True)
    assert (stats["calls"] >= 1) == parallel, stats
    assert np.array_equal(out, alone)


@pytest.mark.parametrize("linger_us", [0, 5_000_000])
def test_a_replay_keeps_the_workers_spinning_after_it(pool, linger_us):
    # each replayed run ends with pool_linger: idle workers spin on (woken if asleep) for pool_linger_us, so a small
    # conv after it (which never wakes a sleeper) finds one awake; with the linger off it runs on the caller alone
    small_feeds, alone, probe = _small_conv_probe(linger_us)
    big, big_feeds = _conv(64, 32)
    session = hetero.Session(big, backends=["cpu"], threads=2)
    for _ in range(3):  # planned, then replayed: a replay ends with pool_linger
        session.run(big_feeds)
    time.sleep(0.05)  # without the linger the worker is asleep by now (spin 0)
    if linger_us:  # a busy machine may run the woken worker late: wait until its clock shows it spinning
        start, deadline = _native.pool_cpu_ns()[1], time.monotonic() + 3
        while _native.pool_cpu_ns()[1] < start + 5_000_000 and time.monotonic() < deadline:
            time.sleep(0.005)
    _assert_probe_ran(probe, small_feeds, alone, parallel=linger_us > 0)


def test_linger_settings():
    before = _native.pool_linger_us()
    try:
        with pytest.raises(ValueError):
            _native.set_pool_linger_us(-1)
        _native.set_pool_linger_us(300)
        assert _native.pool_linger_us() == 300
        _native.pool_linger()  # with or without a pool: nothing to return, nothing run
    finally:
        _native.set_pool_linger_us(0)
        _native.set_pool_linger_us(before)


@pytest.mark.parametrize("linger_us", [0, 200_000])
def test_parallel_calls_during_a_linger_extend_it(pool, linger_us):
    # a parallel call made while a linger is under way moves its end to pool_linger_us from that call: calls spaced
    # past the spin (0 here) but within the linger of each other keep the workers spinning for as long as they come
    # (a run's serial stretches), so a small conv well past the first linger's end still finds one awake
    small_feeds, alone, probe = _small_conv_probe(linger_us)
    for _ in range(3):  # planned, then replayed: the replay ends with pool_linger
        probe.run(small_feeds)
    end = time.monotonic() + 0.6  # three lingers long
    while time.monotonic() < end:
        _native._pool_cover(2, 2, 1)
        time.sleep(0.02)
    _assert_probe_ran(probe, small_feeds, alone, parallel=linger_us > 0)
