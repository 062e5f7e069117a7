"""The LLM kernels across threads: the work split changes no result (every 16-row group is computed whole by one
thread), and the thread pool's statistics (benchmarks/decode_threads.py reads them) account for what ran."""

from __future__ import annotations

import os

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

from hetero.contract import quant  # noqa: E402


def _weights(spec: str, n: int, k: int):
    w = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32)
    if spec == "f16":
        return _native.llm_weights(w.astype(np.float16), "f16", k=k)
    fmt = quant.parse_quant(spec)
    return _native.llm_weights(quant.quantize(w, fmt).reshape(n, -1), fmt.wtype, fmt.block_size, fmt.symmetric, k)


@pytest.mark.parametrize("spec", ["q4", "q8_asym", "f16"])
@pytest.mark.parametrize("n", [16, 1000, 4099])
@pytest.mark.parametrize("m", [1, 3, 70])
def test_result_does_not_depend_on_the_thread_count(spec, n, m):
    k = 512
    w = _weights(spec, n, k)
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    before = _native.num_threads()
    outs = []
    try:
        for threads in (1, 2, 3):
            _native.set_num_threads(threads)
            out = np.empty((m, n), np.float32)
            _native.llm_matmul(w, x, out)
            outs.append(out)
    finally:
        _native.set_num_threads(before)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


def test_pool_statistics_account_for_a_parallel_gemv(pool):
    _native.set_num_threads(2)
    w = _weights("q4", 8192, 1024)  # 512 groups: well above the split's threshold
    x = np.ones((1, 1024), np.float32)
    out = np.empty((1, 8192), np.float32)
    _native.llm_matmul(w, x, out)
    s = _native.pool_stats(True)
    assert s["calls"] == 1
    assert s["tasks"] >= 2  # equal tasks (4 a thread), or one block of bytes a thread (HETERO_LLM_BLOCKS=1)
    assert s["joins"] <= 1 and s["sleeps"] <= s["joins"]
    assert 0 < s["busy_s"] <= 2 * s["wall_s"] + 1e-3
    assert 0 <= s["tail_s"] <= s["wall_s"]
    # the end spread: each tasked thread's wait from its last task's end to the last one's (none when one ran)
    assert 0 <= s["idle_s"] <= s["wall_s"] and (s["joins"] or s["idle_s"] == 0)
    assert _native.pool_stats()["calls"] == 0  # reset


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("spec", ["q4", "q8", "q4_asym"])
def test_decode_split_with_late_workers_changes_no_result(pool, threads, spec):
    """One-row GEMVs across threads with the workers asleep (spin 0: the caller takes their share before they wake,
    or part of it) and spinning: every row comes out bitwise as at one thread, the bias added once. Under
    HETERO_LLM_BLOCKS=1 (test_fuse.py runs this test so) the split by bytes: the caller takes the back half of a
    late worker's block, then of what is left, and so on."""
    w = _weights(spec, 3001, 768)  # 188 groups, the last one short
    bias = np.linspace(-2, 2, 3001, dtype=np.float32)
    x = np.random.default_rng(3).standard_normal((1, 768)).astype(np.float32)
    _native.set_num_threads(1)
    want = np.empty((1, 3001), np.float32)
    _native.llm_matmul(w, x, want, bias)
    _native.set_num_threads(threads)
    for spin in (0, 50):
        _native.set_pool_spin_us(spin)
        for _ in range(20):
            out = np.full((1, 3001), np.nan, np.float32)
            _native.llm_matmul(w, x, out, bias)
            assert np.array_equal(out, want)


def _q8_random(n: int, k: int):
    """q8 weights of random quants and small scales, fast to make at an LM head's size (no float quantization)."""
    rng = np.random.default_rng(5)
    blocks = rng.integers(0, 256, size=(n, k // 32, 34), dtype=np.uint8)
    blocks[..., 0:2] = rng.uniform(0.001, 0.01, size=(n, k // 32, 1)).astype(np.float16).view(np.uint8)
    return _native.llm_weights(blocks.reshape(n, -1), "q8", 32, True, k)


@pytest.fixture
def decode_split():
    before = _native.llm_decode_split(-1)
    yield
    _native.llm_decode_split(before)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("m", [1, 3])
def test_big_gemv_split_by_bytes_changes_no_result(pool, decode_split, threads, m):
    """HETERO_LLM_BLOCKS=3 (llm_decode_split(3)): a one-row-tile GEMV of >= 16 MiB of weights (an LM head) is split
    by bytes, one block a thread (the pool's task count: one a thread), a smaller one keeps the equal tasks (4 a
    thread); mode 2 keeps the equal tasks for both. Every row, its bias added once, bitwise as at one thread, with
    the workers asleep (spin 0: the caller takes the back halves of a late worker's block) and spinning."""
    k = 1024
    big, small = _q8_random(15457, k), _q8_random(3001, k)  # 967 groups (16.8 MB, the last group short), 188
    x = np.random.default_rng(6).standard_normal((m, k)).astype(np.float32)
    want = {}
    _native.set_num_threads(1)
    for name, w in (("big", big), ("small", small)):
        bias = np.linspace(-1, 1, w.n, dtype=np.float32)
        want[name] = np.empty((m, w.n), np.float32)
        _native.llm_matmul(w, x, want[name], bias)
    _native.set_num_threads(threads)
    for mode in (2, 3):
        _native.llm_decode_split(mode)
        for spin in (0, 50):
            _native.set_pool_spin_us(spin)
            for name, w in (("big", big), ("small", small)):
                bias = np.linspace(-1, 1, w.n, dtype=np.float32)
                _native.pool_stats(True)
                for _ in range(3):
                    out = np.full((m, w.n), np.nan, np.float32)
                    _native.llm_matmul(w, x, out, bias)
                    assert np.array_equal(out, want[name]), (mode, spin, name)
                s = _native.pool_stats(True)
                assert s["calls"] == 3
                if mode == 3 and name == "big":
                    assert s["tasks"] == 3 * threads, (mode, name, s["tasks"])  # one block a thread
                elif not any(v in os.environ for v in ("HETERO_LLM_TASKS", "HETERO_LLM_SHRINK")):  # test_fuse.py's
                    assert s["tasks"] == 3 * threads * 4, (mode, name, s["tasks"])  # the equal tasks
    assert _native.llm_decode_split(-1) == 3  # -1 reads the mode


def test_pool_statistics_count_serial_calls_and_stay_off_by_default(pool):
    _native.set_num_threads(1)
    w = _weights("q4", 256, 256)
    x = np.ones((1, 256), np.float32)
    out = np.empty((1, 256), np.float32)
    _native.llm_matmul(w, x, out)
    s = _native.pool_stats(True)
    assert s["calls"] == 0 and s["serial_calls"] >= 1 and s["serial_s"] > 0
    _native.pool_stats_enable(False)
    _native.llm_matmul(w, x, out)
    assert _native.pool_stats()["serial_calls"] == 0


def test_pool_spin_is_settable_and_checked(pool):
    _native.set_pool_spin_us(0)  # workers sleep at once: calls still complete
    _native.set_num_threads(2)
    w = _weights("q8", 4096, 1024)
    x = np.ones((2, 1024), np.float32)
    out = np.empty((2, 4096), np.float32)
    for _ in range(3):
        _native.llm_matmul(w, x, out)
    assert _native.pool_spin_us() == 0
    with pytest.raises(ValueError, match="set_pool_spin_us"):
        _native.set_pool_spin_us(-1)


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("spin", [0, 20, 5000])
def test_pool_runs_every_task_exactly_once(pool, threads, spin):
    # The lock-free dispatch: every call runs each of its tasks once, whether the workers spin between calls or
    # sleep (spin 0), for task counts below, at and above the thread count, and with max_threads limiting joiners.
    _native.set_num_threads(threads)
    _native.set_pool_spin_us(spin)
    for ntasks in (2, 3, 7, 64, 1001):
        for max_threads in (2, threads):
            counts = _native._pool_cover(ntasks, max_threads, 50)
            assert counts.tolist() == [50] * ntasks, (ntasks, max_threads)
    s = _native.pool_stats(True)
    assert s["calls"] == 5 * 2 * 50 and s["tasks"] == 50 * 2 * (2 + 3 + 7 + 64 + 1001)
    assert s["joins"] <= s["calls"] * (threads - 1)


def test_pool_task_error_reaches_the_caller_and_the_pool_goes_on(pool):
    _native.set_num_threads(2)
    with pytest.raises(RuntimeError, match="task 5 failed"):
        _native._pool_cover(64, 2, 3, throw_at=5)
    assert _native._pool_cover(64, 2, 10).tolist() == [10] * 64


def test_pool_serves_concurrent_callers(pool):
    # A caller that finds the pool busy runs its tasks alone: nothing is lost or run twice either way.
    import threading

    _native.set_num_threads(2)
    results = []

    def call():
        results.append(_native._pool_cover(257, 2, 200))

    ts = [threading.Thread(target=call) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(results) == 3 and all(r.tolist() == [200] * 257 for r in results)


@pytest.mark.parametrize("kv_dtype", ["f16", "f32", "q8", "q4r"])
@pytest.mark.parametrize("hq,hkv,d", [(16, 8, 128), (12, 2, 128), (4, 4, 32), (3, 1, 64)])  # q4r: d % 32 == 0
def test_attention_does_not_depend_on_the_thread_count(kv_dtype, hq, hkv, d):
    """A decode step's attention runs one task per kv head that appends the head's keys and values, then computes
    its rows (llm.cpp attention_run); a prefill appends every head first. Both give the same bits at any thread
    count: prefill, decode steps across a key tile's end, a rollback, a short chunk; the cache's bytes too."""
    rng = np.random.default_rng(2)
    schedule = [(9, 0), *((1, p) for p in range(9, 70)), (1, 30), (4, 31), (1, 35)]  # (T, past)
    steps = [(*(rng.standard_normal((t, h, d)).astype(np.float32) for h in (hq, hkv, hkv)), past)
             for t, past in schedule]
    before = _native.num_threads()
    runs = []
    try:
        for threads in (1, 2, 3):
            _native.set_num_threads(threads)
            cache = _native.LlmAttention(hkv, d, 80, kv_dtype)
            outs = []
            for q, k, v, past in steps:
                out = np.full((q.shape[0], hq * d), np.nan, np.float32)
                cache(q, k, v, past, 0.1, out)
                outs.append(out)
            runs.append((outs, [a.copy() for a in cache.export(cache.filled)]))
    finally:
        _native.set_num_threads(before)
    for outs, cached in runs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(runs[0][0], outs, strict=True))
        assert all(np.array_equal(a, b) for a, b in zip(runs[0][1], cached, strict=True))
    assert not np.isnan(np.concatenate([o.ravel() for o in runs[0][0]])).any()
