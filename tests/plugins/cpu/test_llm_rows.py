"""The quantized GEMM of a few rows (a speculative verify step of M <= 16 tokens, a batch of decode slots) gives every
row bitwise what a one-row GEMV of that row gives, for every quantized format and LLM kernel path (the multi-row
tiles of llm_impl.hpp / llm_qgemm_rows.hpp against the M = 1 path). The greedy identity of speculative decoding
rests on it: a verify step's rows must be exactly the logits of the decode steps they stand for."""

from __future__ import annotations

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

from hetero.contract import quant  # noqa: E402
from hetero.contract.quant import QuantFormat, quantize  # noqa: E402

from .test_llm_kernels import f32, path, random_ggml  # noqa: E402, F401  (path: the per-ISA fixture)

pytestmark = pytest.mark.usefixtures("path")  # every test once per LLM kernel path

HETERO_FORMATS = [QuantFormat(bits, bs, sym) for bits in (4, 8) for bs in (32, 64, 128) for sym in (True, False)]
ROWS = (2, 3, 4, 5, 6, 7, 8, 11, 16)  # one tile of each size, a wide tile (VNNI) or 8 + a remainder, the verify maximum
WIDE = tuple(range(9, 17))  # a verify step of 8-15 drafts: VNNI's wide tiles (12 and 16 accumulators), else 8 + rest


def weights_of(spec: str, n: int, k: int):
    if spec in quant.GGML_FORMATS:
        return _native.llm_weights(random_ggml(spec, n, k, seed=n + k), spec, k=k)
    fmt = next(f for f in HETERO_FORMATS if f.name == spec)
    return _native.llm_weights(quantize(f32(n, k, seed=n + k), fmt), fmt.wtype, fmt.block_size, fmt.symmetric, k)


def check_rows_match_one_row_gemv(w, n: int, k: int, threads: int, rows: tuple[int, ...] = ROWS) -> None:
    before = _native.num_threads()
    _native.set_num_threads(threads)
    try:
        for m in rows:
            x = f32(m, k, seed=m) * np.float32(3.0)
            x[0, :7] = 0.0  # a block partly zero, and an all-zero block in the last row when k allows
            x[-1, :32] = 0.0
            got = np.full((m, n), np.nan, np.float32)
            _native.llm_matmul(w, x, got)
            for r in range(m):
                one = np.full((1, n), np.nan, np.float32)
                _native.llm_matmul(w, x[r:r + 1].copy(), one)
                np.testing.assert_array_equal(got[r], one[0], err_msg=f"row {r} of {m}")
    finally:
        _native.set_num_threads(before)


@pytest.mark.parametrize("wtype", list(quant.GGML_FORMATS))
@pytest.mark.parametrize("n", [37, 70])
def test_gguf_rows_bitwise_one_row(wtype, n):
    k = 768 if wtype.endswith("_k") else 224
    check_rows_match_one_row_gemv(weights_of(wtype, n, k), n, k, threads=1)


@pytest.mark.parametrize("spec", [f.name for f in HETERO_FORMATS])
def test_hetero_formats_rows_bitwise_one_row(spec):
    n, k = 45, 384  # 3 / 6 / 12 blocks
    check_rows_match_one_row_gemv(weights_of(spec, n, k), n, k, threads=1)


@pytest.mark.parametrize("wtype", ["q4_k", "q6_k", "q5_0"])
def test_rows_bitwise_one_row_two_threads(wtype):
    n, k = 100, 512
    check_rows_match_one_row_gemv(weights_of(wtype, n, k), n, k, threads=2)


@pytest.mark.parametrize("wtype", ["q5_0", "q5_1"])
def test_q5_rows_bitwise_one_row_at_qwen_width(wtype):
    n, k = 131, 896  # Qwen2.5-0.5B's width (28 blocks), a group tail of 3 rows
    check_rows_match_one_row_gemv(weights_of(wtype, n, k), n, k, threads=1)


@pytest.mark.parametrize("wtype", ["q4_k", "q5_k", "q6_k", "q5_0", "q4_asym_b32"])
def test_rows_bitwise_one_row_at_long_k(wtype):
    # Long K, where a 16-row group passes L1 between two reads of an x line (AVX2 walks each group once per 8-lane
    # half): K = 2816 and a 1.5B down_proj's 8960 -- also several ~8 KiB chunks of a group and a short last one for
    # a tile that walks K in chunks (branch spec's rows_k_chunk, not landed).
    n = 33
    for k in (2816, 8960):
        check_rows_match_one_row_gemv(weights_of(wtype, n, k), n, k, threads=1, rows=(2, 3, 8))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("wtype", [*quant.GGML_FORMATS, "q4", "q8", "q4_asym", "q8_asym"])
def test_verify_rows_9_to_16_bitwise_one_row(wtype, threads):
    """Every row count of a verify step past one 8-row tile, every format the wide tile takes (blocks of 32), at 1
    and 2 threads; hetero's formats at blocks of 32 (the wide tile) and 64 (8-row tiles + the rest)."""
    if wtype in quant.GGML_FORMATS:
        n, k = 70, 768 if wtype.endswith("_k") else 224
        check_rows_match_one_row_gemv(weights_of(wtype, n, k), n, k, threads=threads, rows=WIDE)
        return
    bits, sym = int(wtype[1]), not wtype.endswith("_asym")
    for bs in (32, 64):
        fmt = QuantFormat(bits, bs, sym)
        n, k = 45, 384
        w = _native.llm_weights(quantize(f32(n, k, seed=n + k), fmt), fmt.wtype, fmt.block_size, fmt.symmetric, k)
        check_rows_match_one_row_gemv(w, n, k, threads=threads, rows=WIDE)
