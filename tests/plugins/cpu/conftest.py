"""Fixtures shared by the cpu plugin's tests: every ISA path the plugin builds for this machine's architecture
(the ones this CPU cannot run are skipped with the reason), and 1 / 2 threads."""

from __future__ import annotations

import platform

import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

# The ISA paths plugins/cpu/CMakeLists.txt compiles per architecture, best first.
_BUILT = {"x86_64": ["avx512", "avx2", "generic"], "amd64": ["avx512", "avx2", "generic"],
          "aarch64": ["neon", "generic"], "arm64": ["neon", "generic"]}
_NEEDS = {"avx512": "AVX-512 F/BW/DQ/VL", "avx512vnni": "AVX-512 VNNI", "avx512vbmi": "AVX-512 VNNI + VBMI + GFNI",
          "avx2": "AVX2 + FMA"}


def isa_param(name: str, available: list[str]):
    """``name`` as a pytest param, skipped with the reason when this CPU cannot run it. No emulator stands in:
    Intel SDE is not packaged for Debian and QEMU's TCG has no AVX-512."""
    if name in available:
        return pytest.param(name)
    reason = (f"this CPU has no {_NEEDS.get(name, name)}: the {name} path cannot run here "
              f"(available: {', '.join(available)})")
    return pytest.param(name, marks=pytest.mark.skip(reason=reason))


def built_isas() -> list[str]:
    return _BUILT.get(platform.machine().lower(), ["generic"])


@pytest.fixture(params=[isa_param(name, _native.available_isas()) for name in built_isas()])
def isa(request):
    """Runs the test once per ISA path (avx512 / avx2 / neon / generic)."""
    before = _native.isa()
    _native.set_isa(request.param)
    yield request.param
    _native.set_isa(before)


def thread_counts(*counts: int):
    """A ``threads`` fixture that runs a test once per thread count (the pool's size restored after); a test file
    that needs other counts than the default 1 / 2 rebinds ``threads = thread_counts(...)``."""

    @pytest.fixture(params=list(counts), ids=[f"t{c}" for c in counts])
    def threads(request):
        before = _native.num_threads()
        _native.set_num_threads(request.param)
        yield request.param
        _native.set_num_threads(before)

    return threads


threads = thread_counts(1, 2)


@pytest.fixture
def pool():
    """Pool statistics on and reset; the thread count and the workers' spin and linger restored afterwards."""
    before_threads, before_spin = _native.num_threads(), _native.pool_spin_us()
    before_linger = _native.pool_linger_us()
    _native.pool_stats(True)
    _native.pool_stats_enable(True)
    yield
    _native.pool_stats_enable(False)
    _native.pool_stats(True)
    _native.set_pool_spin_us(before_spin)
    _native.set_pool_linger_us(0)  # ends a linger a test started
    _native.set_pool_linger_us(before_linger)
    _native.set_num_threads(before_threads)
