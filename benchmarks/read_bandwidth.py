"""Memory read bandwidth with N threads of one process (native: benchmarks/native/read_bandwidth.cpp, built here
with the system C++ compiler), the ceiling an LLM decode step at N threads can reach: "% of bound" is the step's
weight bytes per second over this figure at the same thread count.

    python benchmarks/read_bandwidth.py [--threads 1,2] [--mib 256] [--reps 9] [--rounds 3] [--json]

Each thread streams its own buffer of --mib MiB (first touched by that thread, far larger than the caches); a pass
ends when the slowest thread ends. Every run is made twice, the buffers on the allocator's ordinary 4 KiB pages and
on 2 MiB pages (Linux transparent huge pages on request, as hetero's repacked weights: on a virtual machine a TLB
miss is a two-level page walk, and a 4 KiB-page stream takes one every 64 cache lines); the bound is the faster.
Thread counts run in --rounds interleaved rounds; the figure is the best pass
(on a shared machine a neighbour only ever subtracts bandwidth) with the median beside it. The load average is
printed: on a busy machine the figures are a lower bound.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "native" / "read_bandwidth.cpp"
HEADER = SOURCE.with_name("bench_threads.hpp")


def build() -> Path:
    """The probe's binary, compiled once per source version into the temp directory."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        raise SystemExit("read_bandwidth: no C++ compiler found (set CXX)")
    digest = hashlib.sha256(SOURCE.read_bytes() + HEADER.read_bytes()).hexdigest()[:12]
    exe = Path(tempfile.gettempdir()) / f"hetero-read-bandwidth-{digest}"
    if not exe.exists():
        tmp = exe.with_suffix(".tmp")
        subprocess.run([cxx, "-O3", "-std=c++17", "-pthread", str(SOURCE), "-o", str(tmp)], check=True)
        tmp.replace(exe)
    return exe


PAGES = ("4k", "2m")


def measure(threads: list[int], mib: int = 256, reps: int = 9, rounds: int = 3,
            clock: str = "wall") -> dict[int, dict[str, float]]:
    """{threads: {"best": GB/s, "median": GB/s, "best_4k": ..., "best_2m": ..., "best_cpu": ...}} over all passes of
    all rounds, the buffers on ordinary pages (4k) and on 2 MiB pages (2m: what hetero's repacked weights use)
    alternately; "best" and "median" are over both kinds (the ceiling is the faster one). clock "cpu": a pass's time
    is the slowest thread's CPU time instead of the wall time (on a busy machine: without the time a thread was
    descheduled). "best_cpu": the best pass by CPU time whatever ``clock`` (the same passes: where it is far above
    the wall-clock "best", the probe lost CPU time to other processes rather than meeting slower memory)."""
    exe = build()
    passes: dict[tuple[int, str], list[float]] = {(n, p): [] for n in threads for p in PAGES}
    cpu_passes: dict[int, list[float]] = {n: [] for n in threads}
    for _ in range(rounds):
        for n in threads:
            for pages in PAGES:
                out = subprocess.run([str(exe), str(n), str(mib), str(reps), pages], check=True, capture_output=True,
                                     text=True)
                rec = json.loads(out.stdout)
                secs = rec["seconds" if clock == "wall" else "cpu_seconds"][1:]  # the 1st: a warm-up
                passes[n, pages] += [rec["bytes_per_pass"] / s / 1e9 for s in secs]
                cpu_passes[n] += [rec["bytes_per_pass"] / s / 1e9 for s in rec["cpu_seconds"][1:] if s > 0]
    res: dict[int, dict[str, float]] = {}
    for n in threads:
        both = sorted(passes[n, "4k"] + passes[n, "2m"])
        res[n] = {"best": both[-1], "median": both[len(both) // 2],
                  **{f"best_{p}": max(passes[n, p]) for p in PAGES},
                  "best_cpu": max(cpu_passes[n], default=float("nan"))}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--mib", type=int, default=256, help="MiB streamed per thread per pass")
    ap.add_argument("--reps", type=int, default=9, help="passes per run (the first is a warm-up)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    load_before = os.getloadavg()
    res = measure([int(t) for t in args.threads.split(",")], args.mib, args.reps, args.rounds)
    load_after = os.getloadavg()
    if args.json:
        print(json.dumps({"load_avg": [load_before, load_after], "gbps": res}))
        return
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min)")
    for n, r in res.items():
        print(f"  {n} thread{'s' if n > 1 else ' '}: best {r['best']:6.1f} GB/s   median {r['median']:6.1f} GB/s   "
              f"(best on 4 KiB pages {r['best_4k']:.1f}, on 2 MiB pages {r['best_2m']:.1f})")


if __name__ == "__main__":
    main()
