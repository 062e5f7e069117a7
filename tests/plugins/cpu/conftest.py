"""Fixtures shared by the cpu plugin's tests: every ISA path this CPU has, and 1 / 2 threads."""

from __future__ import annotations

import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)


@pytest.fixture(params=_native.available_isas())
def isa(request):
    """Runs the test once per available ISA path (avx512 / avx2 / neon / generic)."""
    before = _native.isa()
    _native.set_isa(request.param)
    yield request.param
    _native.set_isa(before)


@pytest.fixture(params=[1, 2], ids=["t1", "t2"])
def threads(request):
    before = _native.num_threads()
    _native.set_num_threads(request.param)
    yield request.param
    _native.set_num_threads(before)
