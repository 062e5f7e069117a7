"""Memory read bandwidth with N threads of one process (native: benchmarks/native/read_bandwidth.cpp, built here
with the system C++ compiler), the ceiling an LLM decode step at N threads can reach: "% of bound" is the step's
weight bytes per second over this figure at the same thread count.

    python benchmarks/read_bandwidth.py [--threads 1,2] [--mib 256] [--reps 9] [--rounds 3] [--json]

Each thread streams its own buffer of --mib MiB (first touched by that thread, far larger than the caches); a pass
ends when the slowest thread ends. Thread counts run in --rounds interleaved rounds; the figure is the best pass
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


def build() -> Path:
    """The probe's binary, compiled once per source version into the temp directory."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        raise SystemExit("read_bandwidth: no C++ compiler found (set CXX)")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    exe = Path(tempfile.gettempdir()) / f"hetero-read-bandwidth-{digest}"
    if not exe.exists():
        tmp = exe.with_suffix(".tmp")
        subprocess.run([cxx, "-O3", "-std=c++17", "-pthread", str(SOURCE), "-o", str(tmp)], check=True)
        tmp.replace(exe)
    return exe


def measure(threads: list[int], mib: int = 256, reps: int = 9, rounds: int = 3) -> dict[int, dict[str, float]]:
    """{threads: {"best": GB/s, "median": GB/s}} over all passes of all rounds."""
    exe = build()
    passes: dict[int, list[float]] = {n: [] for n in threads}
    for _ in range(rounds):
        for n in threads:
            out = subprocess.run([str(exe), str(n), str(mib), str(reps)], check=True, capture_output=True, text=True)
            rec = json.loads(out.stdout)
            passes[n] += [rec["bytes_per_pass"] / s / 1e9 for s in rec["seconds"][1:]]  # the first pass warms up
    return {n: {"best": max(v), "median": sorted(v)[len(v) // 2]} for n, v in passes.items()}


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
        print(f"  {n} thread{'s' if n > 1 else ' '}: best {r['best']:6.1f} GB/s   median {r['median']:6.1f} GB/s")


if __name__ == "__main__":
    main()
