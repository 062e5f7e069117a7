"""The cpu kernels' one-call forms of a step of several sequences (hetero.llm.batch): ``llm_attention_runs`` runs
each sequence's rows on its own KV cache in one native call, ``LlmRope.rows`` rotates each row at its own position —
bit for bit what one call per sequence (per row) computes; bad runs are refused before anything is written."""

from __future__ import annotations

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

from .conftest import thread_counts  # noqa: E402

rng = np.random.default_rng(11)
HQ, HKV, D, CONTEXT = 4, 2, 64, 96


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _caches(n: int, kind: str) -> list:
    return [_native.LlmAttention(HKV, D, CONTEXT, kind) for _ in range(n)]


# Every run's tasks go in one parallel loop (a step of decode rows and short chunks); a q4r / q3r chunk of several
# row blocks (CHUNK rows: its tiles decoded up front) sends the step run by run. Both at 1, 2 and 3 threads.
threads = thread_counts(1, 2, 3)
CHUNK = 20  # 20 x 2 query heads per kv head = 40 rows: two blocks of 32


@pytest.mark.parametrize("kind", ["f16", "f32", "q8", "q4r", "q3r"])
@pytest.mark.parametrize("chunk", [5, CHUNK])
def test_attention_runs_equal_one_call_per_sequence(kind, chunk, threads):
    # three sequences prefilled to different lengths (one past a 64-position K tile), then one step holding a decode
    # row of sequence 0, a chunk of sequence 2 and decode rows of 1 and (again, later) 0's next position
    lengths = [70, 9, 0]
    one, many = _caches(3, kind), _caches(3, kind)
    scale = 1.0 / np.sqrt(D)
    for i, n in enumerate(lengths):
        if n:
            q, k, v = f32(n, HQ, D), f32(n, HKV, D), f32(n, HKV, D)
            for caches in (one, many):
                caches[i](q, k, v, 0, scale, np.empty((n, HQ * D), np.float32))
    runs = np.array([[0, 0, 1, 70], [2, 1, 1 + chunk, 0], [1, 1 + chunk, 2 + chunk, 9], [0, 2 + chunk, 3 + chunk, 71]],
                    dtype=np.int64)
    t = 3 + chunk
    q, k, v = f32(t, HQ, D), f32(t, HKV, D), f32(t, HKV, D)
    want = np.empty((t, HQ * D), np.float32)
    for c, a, b, pos in runs:
        one[c](q[a:b], k[a:b], v[a:b], int(pos), scale, want[a:b])
    got = np.empty_like(want)
    _native.llm_attention_runs(many, q, k, v, runs, scale, got)
    np.testing.assert_array_equal(got, want)
    assert [c.filled for c in many] == [c.filled for c in one] == [72, 10, chunk]


def test_attention_runs_refuse_a_run_past_its_cache_before_writing():
    caches = _caches(2, "f32")
    q, k, v = f32(2, HQ, D), f32(2, HKV, D), f32(2, HKV, D)
    out = np.empty((2, HQ * D), np.float32)
    bad = [np.array([[0, 0, 1, 0], [1, 1, 2, 3]], dtype=np.int64),  # cache 1 holds 0 positions, not 3
           np.array([[0, 0, 1, CONTEXT]], dtype=np.int64),  # past the context
           np.array([[2, 0, 1, 0]], dtype=np.int64),  # no cache 2
           np.array([[0, 1, 3, 0]], dtype=np.int64)]  # rows past the step's
    for runs in bad:
        with pytest.raises(ValueError, match="llm_attention_runs: run"):
            _native.llm_attention_runs(caches, q, k, v, runs, 0.125, out)
        assert [c.filled for c in caches] == [0, 0]  # nothing was appended
    with pytest.raises(ValueError, match="int64 \\[R, 4\\]"):
        _native.llm_attention_runs(caches, q, k, v, np.zeros((1, 3), np.int64), 0.125, out)
    with pytest.raises(ValueError, match="heads or head size"):
        _native.llm_attention_runs([_native.LlmAttention(HKV, 32, CONTEXT, "f32")], q, k, v,
                                   np.array([[0, 0, 1, 0]], dtype=np.int64), 0.125, out)


def test_rope_rows_equal_a_call_per_row():
    inv = 10000.0 ** (-np.arange(0, 48, 2) / 48)  # partial rotary: 48 of 64 dims
    table = _native.LlmRope(inv)
    x = f32(6, 3, D)
    positions = np.array([300, 4, 5, 0, 17, 301], dtype=np.int64)  # out of order, past the table's first 256
    want = np.empty_like(x)
    for i, p in enumerate(positions):
        _native.LlmRope(inv)(x[i:i + 1], want[i:i + 1], int(p))
    got = np.empty_like(x)
    table.rows(x, got, positions)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="one per row"):
        table.rows(x, got, positions[:5])
    with pytest.raises(ValueError, match=">= 0"):
        table.rows(x, got, np.array([0, 1, -1, 2, 3, 4], dtype=np.int64))
