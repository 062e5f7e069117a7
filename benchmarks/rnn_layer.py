"""One recurrent layer of the CPU plugin on random weights, thread CPU time at one thread (a busy machine): an int8
LSTM layer as com.microsoft::DynamicQuantizeLSTM runs it (``rnn_prepack_q`` / ``rnn_run``), an fp32 GRU layer
(``--gru``, linear_before_reset as the romanizer's), or the int8 GEMM of its input projection alone (``--qgemm``).
Prints the median and minimum of ``--reps`` calls and a checksum of the outputs (equal checksums: the same bits, for
an A/B of two builds run with PYTHONPATH pointing at each, alternated).

    python benchmarks/rnn_layer.py --shape 80,3,40,768 [--dirs 1] [--reps 21]   # voicefilter embedder, layer 1
    python benchmarks/rnn_layer.py --shape 80,1,512,256 --dirs 2                  # tashkeel rawi, layer 2
    python benchmarks/rnn_layer.py --shape 16,3,256,128 --dirs 2 --gru             # romanizer encoder's GRU
    python benchmarks/rnn_layer.py --qgemm 240,768,3072                            # M, K, N

``--shape`` is seq, batch, input, hidden. ``--qgemm`` also prints the rate in G vpdpbusd a second (M K N / 64 / s):
one a cycle is Zen 4's int8 peak, ~3.6 a ns there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from hetero_cpu import _native


def _timed(call: Callable[[], None], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        call()
        times.append(time.thread_time() - t0)
    return times


def _lstm_int8(inp: int, hidden: int, dirs: int, rng: np.random.Generator):
    n = dirs * 4 * hidden
    w = rng.integers(-128, 128, (dirs, inp, 4 * hidden), dtype=np.int8)
    r = rng.integers(-128, 128, (dirs, hidden, 4 * hidden), dtype=np.int8)
    zero, scale = np.zeros(n, np.int32), np.full(n, 0.002, np.float32)
    return _native.rnn_prepack_q(w, r, zero, zero, scale, scale), False


def _gru_fp32(inp: int, hidden: int, dirs: int, rng: np.random.Generator):
    w = (rng.standard_normal((dirs, 3 * hidden, inp)) * 0.1).astype(np.float32)
    r = (rng.standard_normal((dirs, 3 * hidden, hidden)) * 0.1).astype(np.float32)
    return _native.rnn_prepack(w, r, True), True


def layer(shape: list[int], dirs: int, gru: bool, reps: int) -> tuple[list[float], float]:
    seq, batch, inp, hidden = shape
    rng = np.random.default_rng(0)
    packed, is_gru = (_gru_fp32 if gru else _lstm_int8)(inp, hidden, dirs, rng)
    gates = 3 if is_gru else 4
    x = rng.standard_normal((seq, batch, inp)).astype(np.float32)
    b = (rng.standard_normal((dirs, 2 * gates * hidden)) * 0.1).astype(np.float32)
    y = np.zeros((seq, dirs, batch, hidden), np.float32)
    yh = np.zeros((dirs, batch, hidden), np.float32)
    yc = None if is_gru else np.zeros_like(yh)
    direction = 2 if dirs == 2 else 0

    def run() -> None:
        _native.rnn_run(packed, x, b, None, None, None, None, direction, 0.0, False, is_gru, y, yh, yc)

    return _timed(run, reps), float(np.abs(y).sum())


def qgemm(mkn: list[int], reps: int) -> tuple[list[float], float]:
    m, k, n = mkn
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    packed = _native.qpack_b(rng.integers(-128, 128, (k, n), dtype=np.int8), np.array(0, np.int8))
    scale, bias = np.full(n, 0.01, np.float32), np.zeros(n, np.float32)
    out = np.zeros((m, n), np.float32)

    def run() -> None:
        _native.qgemm_f32(a, packed, np.array(3, np.uint8), scale, bias, out)

    return _timed(run, reps), float(np.abs(out).sum())


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=_ints, help="seq,batch,input,hidden")
    parser.add_argument("--dirs", type=int, choices=(1, 2), default=1)
    parser.add_argument("--gru", action="store_true", help="an fp32 GRU layer (default: an int8 LSTM layer)")
    parser.add_argument("--qgemm", type=_ints, help="M,K,N: the int8 GEMM with the F32 stage alone")
    parser.add_argument("--reps", type=int, default=21)
    args = parser.parse_args()
    if (args.shape is None) == (args.qgemm is None):
        parser.error("give --shape or --qgemm")
    _native.set_num_threads(1)
    print(f"load average: {os.getloadavg()}")
    if args.qgemm is not None:
        times, checksum = qgemm(args.qgemm, args.reps)
        m, k, n = args.qgemm
        what = f"qgemm_f32 {m} x {k} x {n}"
        rate = f", {m * k * n / 64 / statistics.median(times) / 1e9:.2f} G vpdpbusd/s"
    else:
        times, checksum = layer(args.shape, args.dirs, args.gru, args.reps)
        seq, batch, inp, hidden = args.shape
        what = f"{'fp32 GRU' if args.gru else 'int8 LSTM'} seq {seq} batch {batch} input {inp} hidden {hidden} " \
               f"dirs {args.dirs}"
        rate = ""
    print(f"{what}: median {statistics.median(times) * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms{rate}, "
          f"checksum {checksum:.6f}")


if __name__ == "__main__":
    main()
