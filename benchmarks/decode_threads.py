"""Where an LLM decode step goes at 1 and 2 threads: the step's weight bytes per second against the N-thread read
bound (benchmarks/read_bandwidth.py), and the native thread pool's own account of its parallel regions: time in
the tasks, the wake-up of the workers, the caller waiting on a tail (imbalance, a late or descheduled worker),
the calls that ran on one thread, and what is left outside them (Python, single-threaded native code).

    python benchmarks/decode_threads.py [--synthetic qwen3-0.6b] [--quant q4] [--threads 1,2] [--spin 50]
                                        [--steps 32] [--rounds 4] [--json]

Every (threads, spin) configuration runs --steps decode steps (the cache rolled back to the same --prompt tokens
first, so every configuration sees the same context lengths) in each of --rounds interleaved rounds; figures are
medians over the steps of the configuration's quietest round (a neighbour on a shared machine only adds time).
--spin takes several values (microseconds a pool worker spins for the next call before it sleeps, see
``_native.set_pool_spin_us``): the configurations then compare spin settings in the same run.

Columns: ``step`` median step time; ``GB/s`` weight bytes of a step (every LlmWeights a kernel holds, the LM head
included) over the step time; ``%bound`` that over the best read bandwidth at the same thread count; per step:
``pooled`` / ``serial`` calls; ``busy/T`` time inside tasks summed over threads divided by the thread count;
``wake`` mean post-to-first-task latency of a joining worker; ``slept`` share of joins that began asleep;
``tail`` the caller's wait for the last task; ``outside`` step time not in any parallel region (Python, and the
native code that runs on the caller without the pool).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def weight_bytes(llm) -> int:
    """Bytes of every block-quantized or float weight the cpu kernels hold (what a decode step streams)."""
    from hetero_cpu import _native

    seen: set[int] = set()
    total = 0
    for _, kernel in llm.session.kernels():
        for value in vars(kernel).values():
            if isinstance(value, _native.LlmWeights) and id(value) not in seen:
                seen.add(id(value))
                total += value.nbytes
    return total


def run_config(llm, native, ids: list[int], prompt: int, steps: int) -> tuple[list[float], dict]:
    """Step times and the pool statistics summed over ``steps`` decode steps after ``prompt`` cached tokens."""
    llm.rollback(prompt)
    llm.forward([ids[prompt]])  # the first step after a thread-count change rebuilds the pool
    native.pool_stats(True)
    times = []
    for i in range(steps):
        llm.rollback(prompt)
        t0 = time.perf_counter()
        llm.forward([ids[prompt + 1 + i % 8]])
        times.append(time.perf_counter() - t0)
    return times, native.pool_stats(True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic", default="qwen3-0.6b")
    ap.add_argument("--quant", default="q4")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--spin", default="50", help="comma-separated pool spin times (us) to compare")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--bandwidth-mib", type=int, default=256, help="MiB per thread of the read-bound probe (0: skip)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    sys.path[:0] = [str(ROOT / "core"), str(ROOT / "plugins" / "cpu"), str(ROOT / "benchmarks")]
    from hetero.llm.synthetic import load_synthetic
    from hetero_cpu import _native

    threads = [int(t) for t in args.threads.split(",")]
    spins = [int(s) for s in args.spin.split(",")]
    load_before = os.getloadavg()
    bound = {}
    if args.bandwidth_mib:
        from read_bandwidth import measure

        bound = measure(threads, args.bandwidth_mib, reps=5, rounds=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = load_synthetic(args.synthetic, args.quant, backends=["cpu"], on_fallback="silent", threads=max(threads),
                             context=args.prompt + 16, progress=False)
    nbytes = weight_bytes(llm)
    ids = list(range(1, args.prompt + 10))
    llm.prefill(ids[:args.prompt])
    configs = [(t, s) for t in threads for s in spins]
    rounds: dict[tuple[int, int], list[tuple[list[float], dict]]] = {c: [] for c in configs}
    spin_before = _native.pool_spin_us()
    _native.pool_stats_enable(True)
    try:
        for _ in range(args.rounds):
            for t, s in configs:
                _native.set_num_threads(t)
                _native.set_pool_spin_us(s)
                rounds[(t, s)].append(run_config(llm, _native, ids, args.prompt, args.steps))
    finally:
        _native.pool_stats_enable(False)
        _native.set_pool_spin_us(spin_before)
    load_after = os.getloadavg()
    rows = []
    for (t, s), runs in rounds.items():
        times, st = min(runs, key=lambda r: sum(r[0]))
        step = statistics.median(times)
        n = len(times)
        gbps = nbytes / step / 1e9
        joins = max(st["joins"], 1)
        rows.append(dict(threads=t, spin_us=s, step_ms=step * 1e3, tok_s=1 / step, gbps=gbps,
                         pct_bound=100 * gbps / bound[t]["best"] if t in bound else None,
                         pooled=st["calls"] / n, serial=st["serial_calls"] / n,
                         busy_ms=st["busy_s"] / n / t * 1e3, wall_ms=st["wall_s"] / n * 1e3,
                         wake_us=st["wake_s"] / joins * 1e6, slept_pct=100 * st["sleeps"] / joins,
                         late=st["late"] / n, tail_ms=st["tail_s"] / n * 1e3, serial_ms=st["serial_s"] / n * 1e3,
                         outside_ms=(sum(times) - st["wall_s"] - st["serial_s"]) / n * 1e3))
    result = dict(model=llm.name, weight_mib=nbytes / 2**20, load_avg=[load_before[0], load_after[0]],
                  read_bound_gbps={t: b["best"] for t, b in bound.items()}, rows=rows)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    bounds = ", ".join(f"{t}T {b['best']:.1f} GB/s" for t, b in bound.items())
    print(f"{llm.name}: {nbytes / 2**20:.1f} MiB of weights per step; load average {load_before[0]:.2f} -> "
          f"{load_after[0]:.2f}; read bound (best) {bounds}")
    print("| T | spin us | step ms | tok/s | GB/s | %bound | pooled | serial | busy/T ms | pooled wall ms | wake us |"
          " slept % | tail ms | serial ms | outside ms |")
    print("|---" * 15 + "|")
    for r in rows:
        pct = "-" if r["pct_bound"] is None else f"{r['pct_bound']:.0f}"
        print(f"| {r['threads']} | {r['spin_us']} | {r['step_ms']:.2f} | {r['tok_s']:.1f} | {r['gbps']:.1f} | {pct} |"
              f" {r['pooled']:.0f} | {r['serial']:.0f} | {r['busy_ms']:.2f} | {r['wall_ms']:.2f} |"
              f" {r['wake_us']:.1f} | {r['slept_pct']:.0f} | {r['tail_ms']:.2f} | {r['serial_ms']:.2f} |"
              f" {r['outside_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
