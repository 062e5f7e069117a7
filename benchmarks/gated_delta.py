"""The GatedDeltaRule op alone on the CPU plugin (``_native.gated_delta``, conv + gating + rule + gated norm): the
chunked prefill form against the per-token recurrence at the Qwen3.5-0.8B / 2B linear-attention shapes (both have
16 key and 16 value heads of 128; only the hidden size differs, which this op does not see). Prints medians of
prompt tokens per second and the chunked / recurrent ratio (median of the per-run ratios of back-to-back runs),
for each thread count.

    PYTHONPATH=core:plugins/cpu python benchmarks/gated_delta.py [--tokens 512] [--threads 1,2] [--isa avx512]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from hetero_cpu import _native

# name: (k_heads, v_heads, k_dim, v_dim, conv taps)
SHAPES = {"qwen3.5-0.8b/2b": (16, 16, 128, 128, 4)}


class Case:
    """Random inputs of one prompt: T new rows from an empty state."""

    def __init__(self, hk: int, hv: int, dk: int, dv: int, k: int, t: int, seed: int = 0) -> None:
        r = np.random.default_rng(seed)
        c = 2 * hk * dk + hv * dv
        self.dims = (hk, hv, dk, dv)
        self.window = np.zeros((t + k - 1, c), dtype=np.float32)
        self.window[k - 1:] = r.standard_normal((t, c), dtype=np.float32)
        self.conv_w = (0.5 * r.standard_normal((c, k))).astype(np.float32)
        self.a = r.standard_normal((t, hv), dtype=np.float32)
        self.b = r.standard_normal((t, hv), dtype=np.float32)
        self.a_log = np.log(r.uniform(1.0, 16.0, hv)).astype(np.float32)  # Qwen3.5's A_log range
        self.dt_bias = np.ones(hv, dtype=np.float32)
        self.z = r.standard_normal((t, hv * dv), dtype=np.float32)
        self.norm_w = np.ones(dv, dtype=np.float32)
        self.state = np.zeros((hv, dk, dv), dtype=np.float32)
        self.out = np.empty((t, hv * dv), dtype=np.float32)

    def run(self, chunk: int) -> None:
        hk, hv, dk, dv = self.dims
        self.state.fill(0.0)
        _native.gated_delta(self.window, self.conv_w, None, self.a, self.b, self.a_log, self.dt_bias, self.z,
                            self.norm_w, self.state, self.out, hk, hv, dk, dv, chunk, chunk or 1,
                            1.0 / dk ** 0.5)


def timings(case: Case, chunks: tuple[int, ...], reps: int) -> list[list[float]]:
    """Seconds of case.run(chunk) per chunk value and run; the forms alternate run by run, so that a load change on
    a shared machine hits both alike."""
    times: list[list[float]] = [[] for _ in chunks]
    for chunk in chunks:
        case.run(chunk)  # warm-up: scratch buffers, caches
    for _ in range(reps):
        for i, chunk in enumerate(chunks):
            t0 = time.perf_counter()
            case.run(chunk)
            times[i].append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=512, help="prompt length (new positions per call)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--isa", default=None, help="ISA path (default: the best this CPU has)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--shape", action="append", default=[], metavar="HK,HV,DK,DV",
                    help="other head shapes (repeatable), e.g. 2,4,16,16 (the qwen3.5-tiny fixture's)")
    args = ap.parse_args()
    shapes = dict(SHAPES)
    for spec in args.shape:
        hk, hv, dk, dv = (int(x) for x in spec.split(","))
        shapes[spec] = (hk, hv, dk, dv, 4)
    if args.isa:
        _native.set_isa(args.isa)
    print(f"isa {_native.isa()}, {args.tokens} tokens from an empty state, medians of {args.reps} runs")
    print("| shape | threads | recurrent t/s | chunked t/s | chunked / recurrent |")
    print("| --- | ---: | ---: | ---: | ---: |")
    before = _native.num_threads()
    for name, shape in shapes.items():
        case = Case(*shape, t=args.tokens)
        for threads in (int(x) for x in args.threads.split(",")):
            _native.set_num_threads(threads)
            rec, chk = timings(case, (0, args.chunk), args.reps)
            gain = statistics.median(r / c for r, c in zip(rec, chk, strict=True))  # paired runs
            print(f"| {name} | {threads} | {args.tokens / statistics.median(rec):.0f} | "
                  f"{args.tokens / statistics.median(chk):.0f} | {gain:.2f}x |")
    _native.set_num_threads(before)


if __name__ == "__main__":
    main()
