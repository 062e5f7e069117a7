"""benchmarks/qgemm_rows.py's native tile benchmark, built against plugins/cpu/src for each ISA this CPU runs: it
exits non-zero when any row of an M = 2 / 4 / 8 tile differs in a bit from the one-row GEMV (q4_k, q6_k, q4_0, q8_0,
q5_0, q5_1, q5_k at the tile level, odd N), and it must keep compiling against the kernel headers it measures. Its
streamed mode (2 threads, each over copies of the matrix on 2 MiB pages) exits non-zero when a thread's output is not
the one-row GEMV's."""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[3]
CPU_FLAGS = {"avx2": {"avx2", "fma", "f16c"}, "avx512": {"avx512f", "avx512bw", "avx512dq", "avx512vl"},
             "avx512vnni": {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"}}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def bench_module():
    return load_script(ROOT / "benchmarks" / "qgemm_rows.py", "qgemm_rows_bench")


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the benchmark's ISAs are x86-64 ones")
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")
@pytest.mark.parametrize("isa", sorted(CPU_FLAGS))
def test_tiles_bitwise_one_row(isa):
    if not CPU_FLAGS[isa] <= cpu_flags():
        pytest.skip(f"this CPU does not run {isa}")
    mod = bench_module()
    res = mod.run(mod.build(isa, mod.INCLUDE), n=72, k=512, reps=1)  # 5 groups, the last one half full
    assert sorted(res) == ["q4_0", "q4_k", "q5_0", "q5_1", "q5_k", "q6_k", "q8_0"]
    for fmt, (n, k, nbytes, t1, digest, ms) in res.items():
        assert (n, k) == (72, 512) and nbytes > 0 and t1 > 0, fmt
        assert len(digest) == 16 and sorted(ms) == [2, 3, 4, 8, 9, 11, 12, 16], fmt  # the M it times (MS)


def _built_for_this_cpu():
    """The benchmark's module and its binary for the best ISA this CPU runs (AVX-512 VNNI, else AVX2)."""
    isa = "avx512vnni" if CPU_FLAGS["avx512vnni"] <= cpu_flags() else "avx2"
    if not CPU_FLAGS[isa] <= cpu_flags():
        pytest.skip("this CPU runs neither AVX2 nor AVX-512 VNNI")
    mod = bench_module()
    return mod, mod.build(isa, mod.INCLUDE)


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the benchmark's ISAs are x86-64 ones")
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")
def test_streamed_gemv_is_the_one_row_gemv():
    mod, exe = _built_for_this_cpu()
    plain = mod.run(exe, n=72, k=512, reps=1)
    for clock in ("wall", "cpu"):  # cpu: the best pass's slowest thread's CPU time
        streamed = mod.run(exe, n=72, k=512, reps=2, stream_mib=1, threads=2, clock=clock)
        assert sorted(streamed) == sorted(plain)
        for fmt, (n, k, nbytes, t1, digest, ms) in streamed.items():
            copies = max(1, (1 << 20) // plain[fmt][2])
            assert (n, k, nbytes, ms) == (72, 512, 2 * copies * plain[fmt][2], {}), fmt
            assert t1 > 0 and digest == plain[fmt][4], fmt


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the benchmark's ISAs are x86-64 ones")
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")
def test_formats_and_env_of_a_run():
    """--formats runs only the named formats (QGEMM_ROWS_FORMATS); an arm's environment (--env) reaches the binary
    and, being a prefetch distance, leaves the outputs' bits alone; the chunked walks (QGEMM_ROWS_CHUNK, with
    QGEMM_ROWS_CHUNK_MAJOR) compute the one-row GEMV (the binary checks them to a relative 1e-4)."""
    mod, exe = _built_for_this_cpu()
    plain = mod.run(exe, n=72, k=512, reps=1)
    some = mod.run(exe, n=72, k=512, reps=1, formats="q8_0,q4_0")
    assert sorted(some) == ["q4_0", "q8_0"]
    streamed = mod.run(exe, n=72, k=512, reps=2, stream_mib=1, threads=2, env={"HETERO_LLM_PF": "1024"},
                       formats="q4_k")
    assert sorted(streamed) == ["q4_k"] and streamed["q4_k"][4] == plain["q4_k"][4]
    for major in ("0", "1"):  # K in chunks of 4 blocks (q4_k: 8, its super-block), the plugin's layout or chunk-major
        chunked = mod.run(exe, n=72, k=512, reps=1, stream_mib=1, threads=2,
                          env={"QGEMM_ROWS_CHUNK": "4", "QGEMM_ROWS_CHUNK_MAJOR": major})
        assert sorted(chunked) == sorted(plain)  # each format's sums checked against the one-row GEMV (else exit 1)
    assert mod.parse_env("HETERO_LLM_PF=1024,X=a=b") == {"HETERO_LLM_PF": "1024", "X": "a=b"}
    assert mod.parse_env("") == {}


def test_rounds_by_phase():
    """--phase-gbs: a round counts in a phase only when both its probes are in it; per arm the median GB/s, % of the
    round's mean probe and time against the first arm, over those rounds alone."""
    mod = bench_module()
    rows = [(60.0, 62.0, {"a": {"q4_0": 61.0}, "b": {"q4_0": 30.5}}),  # fast
            (64.0, 66.0, {"a": {"q4_0": 52.0}, "b": {"q4_0": 26.0}}),  # fast
            (40.0, 42.0, {"a": {"q4_0": 41.0}, "b": {"q4_0": 41.0}}),  # slow
            (40.0, 62.0, {"a": {"q4_0": 1.0}, "b": {"q4_0": 99.0}}),  # the phase changed: in neither
            (50.0, 52.0, {"a": {"q4_0": 1.0}, "b": {"q4_0": 99.0}})]  # between the thresholds: in neither
    res = mod.by_phase(rows, ["a", "b"], 55.0, 48.0)
    count, probes, figures = res["fast"]
    assert count == 2 and probes == pytest.approx(63.0)
    assert figures["a"]["q4_0"] == pytest.approx((56.5, 90.0, 1.0))  # % of probe: median of 100 and 80
    assert figures["b"]["q4_0"] == pytest.approx((28.25, 45.0, 2.0))
    count, probes, figures = res["slow"]
    assert count == 1 and probes == pytest.approx(41.0) and figures["b"]["q4_0"] == pytest.approx((41.0, 100.0, 1.0))
    assert mod.by_phase(rows[3:], ["a", "b"], 55.0, 48.0)["fast"] == (0, 0.0, {})
