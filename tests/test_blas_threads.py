"""numpy's OpenBLAS at one thread inside ``one_blas_thread``, restored after (nested and concurrent blocks and
errors included): hetero.runtime.blas_threads. The speculative loop's use of it: tests/llm/test_speculative.py."""

from __future__ import annotations

import threading

import pytest

from hetero.runtime.blas_threads import blas_threads, one_blas_thread


def _needs_openblas() -> list[int]:
    counts = blas_threads()
    if not counts:
        pytest.skip("numpy here is not linked to OpenBLAS: no thread count to set")
    return counts


def test_one_thread_inside_and_the_count_restored_after():
    original = _needs_openblas()
    from hetero.runtime import blas_threads as module

    setters = [set_ for _, set_ in module._openblas_controls()]
    for set_ in setters:
        set_(2)  # a known count to come back to, whatever the machine's cores
    try:
        with one_blas_thread():
            assert blas_threads() == [1] * len(setters)
            with one_blas_thread():  # nested: still one, and the outer block restores
                assert blas_threads() == [1] * len(setters)
            assert blas_threads() == [1] * len(setters)
        assert blas_threads() == [2] * len(setters)
        with pytest.raises(ValueError), one_blas_thread():
            raise ValueError("inside")
        assert blas_threads() == [2] * len(setters)
    finally:
        for set_, count in zip(setters, original, strict=True):
            set_(count)


def test_concurrent_blocks_restore_once_the_last_ends():
    before = _needs_openblas()
    inside, release = threading.Barrier(3), threading.Event()
    seen: list[list[int]] = []

    def worker() -> None:
        with one_blas_thread():
            inside.wait()
            release.wait()
            seen.append(blas_threads())

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    assert blas_threads() == [1] * len(before)
    release.set()
    for t in threads:
        t.join()
    assert all(counts == [1] * len(before) for counts in seen)  # the first to end did not restore under the other
    assert blas_threads() == before
