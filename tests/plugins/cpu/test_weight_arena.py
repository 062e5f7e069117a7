"""The repacked weights' memory (llm.cpp ``WeightArena``): weights carved back to back out of shared chunks that ask
Linux for 2 MiB pages compute exactly what weights in allocations of their own compute (``HETERO_LLM_HUGE=0``, in a
fresh process: the setting is read once), keep their bytes when the other weights of their chunk are freed, and,
where the kernel grants transparent huge pages on request, sit on them."""

from __future__ import annotations

import gc
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

from hetero.contract import quant  # noqa: E402

# (spec, N, K): small ones sharing a chunk, one larger than a 32 MiB chunk
SHAPES = [("q4", 16, 64), ("q8_asym", 1000, 512), ("q4", 4099, 256), ("q8", 64, 4096), ("q8", 8192, 4608),
          ("q4", 300, 1024)]


def _weights(spec: str, n: int, k: int, seed: int):
    """A quantized [n, k] weight; past 512 rows, 512 quantized rows repeated (quantizing in numpy is slow)."""
    fmt = quant.parse_quant(spec)
    w = np.random.default_rng(seed).standard_normal((min(n, 512), k)).astype(np.float32)
    q = quant.quantize(w, fmt).reshape(w.shape[0], -1)
    q = np.ascontiguousarray(np.resize(q, (n, q.shape[1])))
    return _native.llm_weights(q, fmt.wtype, fmt.block_size, fmt.symmetric, k)


def _run(w, k: int, n: int) -> np.ndarray:
    x = np.random.default_rng(k + n).standard_normal((2, k)).astype(np.float32)
    out = np.empty((2, n), np.float32)
    _native.llm_matmul(w, x, out)
    return out


def digest() -> str:
    h = hashlib.sha256()
    for i, (spec, n, k) in enumerate(SHAPES):
        h.update(_run(_weights(spec, n, k, i), k, n).tobytes())
    return h.hexdigest()


def _fresh(function: str, huge: str) -> str:
    """What this module's ``function()`` returns in a fresh process with HETERO_LLM_HUGE=huge (read once)."""
    root = Path(__file__).resolve().parents[3]
    code = f"from tests.plugins.cpu.test_weight_arena import {function} as f; print(f())"
    env = {**os.environ, "HETERO_LLM_HUGE": huge, "HETERO_NUM_THREADS": "2"}
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def _arms(function: str) -> dict[str, str]:
    """``_fresh`` with the arena (HETERO_LLM_HUGE=1) and without."""
    return {huge: _fresh(function, huge) for huge in ("1", "0")}


def test_weights_compute_the_same_bits_with_and_without_the_arena():
    got = _arms("digest")
    assert got["1"] == got["0"] and len(got["1"]) == 64


def test_weights_keep_their_bytes_when_their_neighbours_are_freed():
    made = [(_weights(spec, n, k, i), n, k) for i, (spec, n, k) in enumerate(SHAPES * 2)]
    before = [_run(w, k, n) for w, n, k in made]
    kept = made[::2]  # every other weight freed: the chunks they shared stay alive for the rest
    del made
    gc.collect()
    fresh = [(_weights(spec, n, k, 100 + i), n, k) for i, (spec, n, k) in enumerate(SHAPES)]  # carved after them
    for (w, n, k), ref in zip(kept, before[::2], strict=True):
        assert np.array_equal(_run(w, k, n), ref)
    assert all(np.isfinite(_run(w, k, n)).all() for w, n, k in fresh)


def _kib(path: str, key: str) -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def _anon_huge_kib() -> int:
    return _kib("/proc/self/smaps_rollup", "AnonHugePages:")


def kib_given_back() -> int:
    """RssAnon (KiB) this process gives back when its only weight (~17 MiB repacked) is freed."""
    w = _weights("q8", 4096, 4096, 9)
    gc.collect()
    held = _kib("/proc/self/status", "RssAnon:")
    del w
    gc.collect()
    return held - _kib("/proc/self/status", "RssAnon:")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_freed_weights_give_their_memory_back():
    assert int(_fresh("kib_given_back", "1")) >= 12 * 1024  # the chunk went with its last weight


def huge_kib_of_a_weight() -> int:
    """AnonHugePages (KiB) of this process after one ~17 MiB repacked weight is made and numpy's arrays are gone."""
    w = _weights("q8", 4096, 4096, 7)
    gc.collect()
    assert np.isfinite(_run(w, 4096, 4096)).all()
    return _anon_huge_kib()


THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages here")
def test_weights_sit_on_huge_pages_where_linux_grants_them():
    kib = {arm: int(v) for arm, v in _arms("huge_kib_of_a_weight").items()}  # the same imports and arrays
    assert kib["1"] - kib["0"] >= 8 * 1024, kib  # most of the weight's 17 MiB on 2 MiB pages
