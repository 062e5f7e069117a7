"""numpy's OpenBLAS kept to one thread around numpy work that runs between native steps.

OpenBLAS runs a large enough matmul on worker threads, which then spin for a while waiting for more work. In a
process whose native thread pool already has a thread per core, those spinning workers take the cores the next
native calls need: after an Eagle-3 head's numpy attention over a 201-token prompt, the next four 2-thread decode
steps of a 0.5B target took 21-29 ms instead of 13 (2026-12-06, AMD EPYC Zen 4 2-core; ~5% of a 64-token reply,
the whole of Eagle-3's loss against plain decoding there; ``benchmarks/spec_steps.py``). One BLAS thread there
costs nothing that matters: the drafter's numpy work is small, and the native pool has the cores.

OpenBLAS has no Python API, so the setter is found in the loaded libraries, as threadpoolctl does: the OpenBLAS
builds numpy ships (``scipy_openblas``, 32- and 64-bit integers) and a plain OpenBLAS. Where none is loaded (numpy
on another BLAS), ``one_blas_thread`` does nothing.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

_NAMES = [(prefix, suffix) for prefix in ("scipy_openblas_", "openblas_") for suffix in ("64_", "")]
_Get = Callable[[], int]
_Set = Callable[[int], None]
_lock = threading.Lock()
_depth = 0  # one_blas_thread blocks open now
_saved: list[int] = []  # each OpenBLAS's thread count before the outermost open block


def _controls_of(lib: ctypes.CDLL) -> tuple[_Get, _Set] | None:
    """The library's (get_num_threads, set_num_threads) under the first of the OpenBLAS builds' names it has."""
    for prefix, suffix in _NAMES:
        get = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
        set_ = getattr(lib, f"{prefix}set_num_threads{suffix}", None)
        if get is not None and set_ is not None:
            get.restype, get.argtypes = ctypes.c_int, []
            set_.restype, set_.argtypes = None, [ctypes.c_int]
            return get, set_
    return None


@cache
def _openblas_controls() -> tuple[tuple[_Get, _Set], ...]:
    """(get_num_threads, set_num_threads) of each OpenBLAS loaded in this process (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line})
    except OSError:
        return ()
    controls = []
    for path in paths:
        try:
            found = _controls_of(ctypes.CDLL(path))
        except OSError:
            continue
        if found is not None:
            controls.append(found)
    return tuple(controls)


def blas_threads() -> list[int]:
    """The thread count of each loaded OpenBLAS (empty where none is found)."""
    return [get() for get, _ in _openblas_controls()]


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """numpy's OpenBLAS at one thread inside; its thread count restored when the outermost block ends (nested and
    concurrent blocks share one setting: the last of them to end restores it)."""
    global _depth
    controls = _openblas_controls()
    if not controls:
        yield
        return
    with _lock:
        if _depth == 0:
            _saved[:] = blas_threads()
            for _, set_ in controls:
                set_(1)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for (_, set_), count in zip(controls, _saved, strict=True):
                    set_(count)
