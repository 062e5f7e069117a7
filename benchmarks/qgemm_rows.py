"""The quantized GEMM tiles of the CPU plugin at M = 1-4, 8, 9, 11, 12, 16 activation rows (native:
benchmarks/native/qgemm_rows.cpp, built here against plugins/cpu/src): the tile the plugin runs for M rows (qgemm_mr,
qgemm_wide for 9-16 rows on VNNI, or qgemm_rows for 2-8 rows on AVX2 / AVX-512 without VNNI), thread CPU time on the
same packed q4_k / q6_k / q4_0 / q8_0 / q5_0 / q5_1 / q5_k weights in one process, one thread. Prints M = 1's time and
GB/s and each M's cost relative to M = 1; exits non-zero if any row of a tile differs in a bit from the one-row GEMV.
``--n 256`` keeps the weights in L2 (the compute cost alone).

``--base REV`` builds the same benchmark a second time against the kernel headers of git revision REV and runs the
two alternately (``--rounds`` times), printing both, new / base, and whether the one-row outputs are the same bits:
a before / after that a busy machine's drift affects alike.

``--stream-mib MIB --threads 1,2`` streams the one-row GEMV from memory instead: each thread runs it over its own
~MIB MiB of copies of the packed matrix on 2 MiB pages (as the plugin's repacked weights), the passes started
together; printed as GB/s of weight bytes per core and as a share of the native read probe
(benchmarks/read_bandwidth.py, 2 MiB pages) measured at the same thread count in the same rounds, alternated.
With ``--calls T`` the copies are instead calls as a decode step makes them: the threads share them, each copy cut in
T equal tasks a thread, task i on thread i % threads (the order a pool's threads that keep pace claim them in), a
barrier after each call; ``--calls 1`` is one contiguous range a thread per call (the cost of the calls' structure,
set against the plain stream).

``--phase-gbs G`` (with ``--stream-mib``) sets each round between its own read probes (one before, one after: the
next round's before) and prints every round: this VM's memory runs in phases (2-thread probes ~37-43 GB/s "slow",
~59-72 "fast", switching every few seconds to minutes), and a median over rounds of both phases measures the mix.
The summary keeps per phase only the rounds whose two probes agree on it (both above G: fast; both below
``--slow-gbs``: slow): each arm's GB/s (all threads together), % of its round's mean probe, and its time against the
first arm's (median of the rounds' paired ratios). The arms: this tree once per ``--env A=1,B=2`` (environment
settings read by the kernels, e.g. HETERO_LLM_PF; QGEMM_CALLS=T: this arm's --calls), ``--base REV`` once per
``--base-env``; ``--formats q4_0,q8_0``
runs only those formats. On a busy machine add ``--clock cpu`` (probes and tiles by their best pass's CPU time).

    python benchmarks/qgemm_rows.py [--n 8960] [--k 1536] [--reps 15] [--isa avx512vnni] [--base main --rounds 5]
    python benchmarks/qgemm_rows.py --isa avx512vbmi --base HEAD --base-isa avx512vnni [--rounds 5]
    python benchmarks/qgemm_rows.py --isa avx512vnni --stream-mib 256 --threads 1,2 [--base main] [--rounds 3]
        [--clock cpu]
    python benchmarks/qgemm_rows.py --isa avx512vnni --n 2048 --k 1024 --stream-mib 128 --threads 2 --clock cpu \
        --calls 4
    python benchmarks/qgemm_rows.py --isa avx512vbmi --stream-mib 128 --threads 2 --clock cpu --phase-gbs 55 \
        --rounds 40 --formats q4_0,q4_k,q8_0 --base REV --base-env HETERO_LLM_PF=1024 --base-env HETERO_LLM_PF=3072
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from io import BytesIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "native" / "qgemm_rows.cpp"
NATIVE_HEADERS = [HERE / "native" / "bench_threads.hpp"]
INCLUDE = HERE.parent / "plugins" / "cpu" / "src"
AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mfma", "-mf16c"]
FLAGS = {"avx2": ["-mavx2", "-mfma", "-mf16c"], "avx512": ["-DROWS_AVX512", *AVX512],
         "avx512vnni": ["-DROWS_VNNI", "-mavx512vnni", *AVX512],
         "avx512vbmi": ["-DROWS_VBMI", "-mavx512vnni", "-mavx512vbmi", "-mgfni", *AVX512]}

# One run's result: format -> (n, k, bytes, seconds at M = 1, hash of the one-row outputs, {M: seconds})
Result = dict[str, tuple[int, int, int, float, str, dict[int, float]]]


def build(isa: str, include: Path) -> Path:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        raise SystemExit("qgemm_rows: no C++ compiler found (set CXX)")
    headers = [*NATIVE_HEADERS, *sorted(include.glob("*.hpp"))]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in [SOURCE, *headers]) + isa.encode())
    exe = Path(tempfile.gettempdir()) / f"hetero-qgemm-rows-{isa}-{digest.hexdigest()[:12]}"
    if not exe.exists():
        tmp = exe.with_suffix(".tmp")
        subprocess.run([cxx, "-O3", "-std=c++17", "-pthread", *FLAGS[isa], f"-I{include}", str(SOURCE), "-o", str(tmp)],
                       check=True)
        tmp.replace(exe)
    return exe


def base_headers(rev: str) -> Path:
    """plugins/cpu/src of git revision rev, extracted into a temporary folder."""
    repo = HERE.parent
    data = subprocess.run(["git", "-C", str(repo), "archive", rev, "plugins/cpu/src"], check=True,
                          capture_output=True).stdout
    out = Path(tempfile.mkdtemp(prefix="hetero-qgemm-base-"))
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(out, filter="data")
    return out / "plugins" / "cpu" / "src"


def run(exe: Path, n: int, k: int, reps: int, stream_mib: int = 0, threads: int = 1, clock: str = "wall",
        calls: int = 0, env: dict[str, str] | None = None, formats: str = "") -> Result:
    """One run of the binary; stream_mib > 0: the streamed one-row GEMV on `threads` threads (no M columns; bytes:
    all threads' per pass; clock "cpu": the seconds are the best pass's slowest thread's CPU time, not the median
    pass's wall time; calls > 0: each copy one call split in `calls` equal tasks a thread, a barrier after each);
    env: variables set for this run only (e.g. HETERO_LLM_PF); formats: comma-separated names, only these."""
    cmd = [str(exe), str(n), str(k), str(reps)] + ([str(stream_mib), str(threads)] if stream_mib > 0 else [])
    cmd += [str(calls)] if stream_mib > 0 and calls > 0 else []
    run_env = {**os.environ, **(env or {})}
    if formats:
        run_env["QGEMM_ROWS_FORMATS"] = formats
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=run_env).stdout
    res: Result = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) > 6 and f[6] == "cpu":  # streamed: "... cpu <seconds>"
            res[f[0]] = (int(f[1]), int(f[2]), int(f[3]), float(f[7] if clock == "cpu" else f[4]), f[5], {})
            continue
        res[f[0]] = (int(f[1]), int(f[2]), int(f[3]), float(f[4]), f[5],
                     {int(f[i]): float(f[i + 1]) for i in range(6, len(f), 2)})
    return res


def median_of(results: list[Result]) -> Result:
    out: Result = {}
    for fmt, (n, k, nbytes, _, digest, ms) in results[0].items():
        out[fmt] = (n, k, nbytes, statistics.median(r[fmt][3] for r in results), digest,
                    {m: statistics.median(r[fmt][5][m] for r in results) for m in ms})
    return out


def describe(res: Result) -> list[str]:
    lines = []
    for fmt, (n, k, nbytes, t1, _, ms) in res.items():
        cols = [f"M={m} {tm / t1:.2f}x" for m, tm in ms.items()]
        lines.append(f"  {fmt} {n}x{k}: M=1 {1e3 * t1:.3f} ms ({nbytes / t1 / 1e9:.1f} GB/s) | " + " | ".join(cols))
    return lines


def parse_env(spec: str) -> dict[str, str]:
    """"A=1,B=2" -> {"A": "1", "B": "2"} ("" -> {})."""
    return dict(kv.split("=", 1) for kv in spec.split(",") if kv)


def stream(args: argparse.Namespace, base: Path | None) -> None:
    """--stream-mib: per ISA and thread count, the streamed one-row GEMV of this tree (and of --base), alternated
    with the read probe over --rounds rounds; medians of the rounds. With --phase-gbs: each round between its own
    probes (one before, one after, the next round's before), the arms in alternating order, every round printed, and
    the rounds split by the memory's phase (module docstring)."""
    from read_bandwidth import measure

    threads = [int(t) for t in args.threads.split(",")]
    for isa in args.isa or sorted(FLAGS):
        # the arms: (name, binary, environment) -- this tree once per --env (default: once, as it is), --base the same
        exe = build(isa, INCLUDE)
        arms = [("this tree" + (f" {e}" if e else ""), exe, parse_env(e)) for e in args.env or [""]]
        if base is not None:
            bexe = build(args.base_isa or isa, base)
            arms += [(f"base {args.base[:12]}" + (f" {e}" if e else ""), bexe, parse_env(e))
                     for e in args.base_env or [""]]
        if args.phase_gbs:
            phased(args, isa, arms, threads, measure)
            continue
        runs: dict[tuple[str, int], list[Result]] = {(name, t): [] for name, _, _ in arms for t in threads}
        bound: dict[int, list[float]] = {t: [] for t in threads}
        for _ in range(args.rounds):
            for t in threads:
                bound[t].append(measure([t], mib=args.stream_mib, reps=5, rounds=1, clock=args.clock)[t]["best_2m"])
                for name, ex, env in arms:
                    runs[name, t].append(run(ex, args.n, args.k, args.reps, args.stream_mib, t, args.clock,
                                             args.calls, env, args.formats))
        for t in threads:
            gbs = statistics.median(bound[t])
            print(f"{isa}, {t} thread{'s' if t > 1 else ''}: read probe {gbs:.1f} GB/s (2 MiB pages, median of rounds"
                  f"{', CPU time' if args.clock == 'cpu' else ''})")
            for name, _, _ in arms:
                res = median_of(runs[name, t])
                cols = [f"{fmt} {nbytes / t1 / 1e9 / t:5.1f} GB/s/core ({100 * nbytes / t1 / 1e9 / gbs:3.0f}%)"
                        for fmt, (_, _, nbytes, t1, _, _) in res.items()]
                print(f"  {name:>16}: " + " | ".join(cols), flush=True)


def phased(args: argparse.Namespace, isa: str, arms: list[tuple[str, Path, dict[str, str]]], threads: list[int],
           measure: Callable[..., dict[int, dict[str, float]]]) -> None:
    """--phase-gbs G: rounds of (probe, the arms in turn -- reversed every other round -- , probe); a round is "fast"
    when both its probes read more than G GB/s, "slow" when both read less than --slow-gbs, else "changed" (left
    out). Per phase: each arm's GB/s (all threads together) and % of the mean of its round's probes, medians over the
    rounds, and its time against the first arm's (median of the rounds' paired ratios)."""
    def probe(t: int) -> float:
        return measure([t], mib=args.stream_mib, reps=5, rounds=1, clock=args.clock)[t]["best_2m"]

    rows: dict[int, list[Row]] = {t: [] for t in threads}  # per round
    hashes: dict[str, dict[str, str]] = {}  # each arm's hash of the one-row outputs, per format
    before = {t: probe(t) for t in threads}
    for r in range(args.rounds):
        for t in threads:
            order = arms if r % 2 == 0 else arms[::-1]
            got = {}
            for name, ex, env in order:
                calls = int(env.get("QGEMM_CALLS", args.calls))  # an arm of its own call structure (--calls)
                res = run(ex, args.n, args.k, args.reps, args.stream_mib, t, args.clock, calls, env, args.formats)
                hashes.setdefault(name, {fmt: v[4] for fmt, v in res.items()})
                got[name] = {fmt: nbytes / t1 / 1e9 for fmt, (_, _, nbytes, t1, _, _) in res.items()}
            after = probe(t)
            rows[t].append((before[t], after, got))
            cols = " | ".join(f"{name}: " + " ".join(f"{fmt} {g:.1f}" for fmt, g in got[name].items())
                              for name, _, _ in arms)
            print(f"{isa} round {r + 1} {t}T probe {before[t]:.1f} -> {after:.1f} GB/s | {cols}", flush=True)
            before[t] = after
    same = all(h == hashes[arms[0][0]] for h in hashes.values())
    print(f"{isa}: one-row outputs of the arms {'the same bits' if same else 'DIFFER'}")
    names = [name for name, _, _ in arms]
    for t in threads:
        label = f"{isa}, {t} thread{'s' if t > 1 else ''}"
        phases = by_phase(rows[t], names, args.phase_gbs, args.slow_gbs)
        for phase, (count, probes, arm_figures) in phases.items():
            if not count:
                print(f"{label}, {phase} phase: no round")
                continue
            print(f"{label}, {phase} phase: {count} of {len(rows[t])} rounds, probes median {probes:.1f} GB/s")
            for name, figures in arm_figures.items():
                row = [f"{fmt} {gbs:5.1f} GB/s {pct:3.0f}% time {rel:.3f}x"
                      for fmt, (gbs, pct, rel) in figures.items()]
                print(f"  {name:>24}: " + " | ".join(row), flush=True)


Row = tuple[float, float, dict[str, dict[str, float]]]  # probe before, probe after, {arm: {format: GB/s}}


def by_phase(rows: list[Row], names: list[str], fast_gbs: float,
             slow_gbs: float) -> dict[str, tuple[int, float, dict[str, dict[str, tuple[float, float, float]]]]]:
    """{"fast" / "slow": (rounds, median of their mean probes, {arm: {format: (GB/s, % of the round's mean probe,
    time against names[0])}})}: medians over the rounds whose probes both read above fast_gbs / both below
    slow_gbs (a round between them, or with one probe on each side, is in neither)."""
    out = {}
    for phase in ("fast", "slow"):
        keep = [(a, b, g) for a, b, g in rows if (min(a, b) > fast_gbs if phase == "fast" else max(a, b) < slow_gbs)]
        figures: dict[str, dict[str, tuple[float, float, float]]] = {}
        for name in names if keep else []:
            figures[name] = {
                fmt: (statistics.median(g[name][fmt] for _, _, g in keep),
                      statistics.median(100 * g[name][fmt] / ((a + b) / 2) for a, b, g in keep),
                      statistics.median(g[names[0]][fmt] / g[name][fmt] for _, _, g in keep))
                for fmt in keep[0][2][name]}
        out[phase] = (len(keep), statistics.median((a + b) / 2 for a, b, _ in keep) if keep else 0.0, figures)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8960)
    parser.add_argument("--k", type=int, default=1536)
    parser.add_argument("--reps", type=int, default=15, help="passes per M within one run (the median is kept)")
    parser.add_argument("--isa", action="append", choices=sorted(FLAGS),
                        help="default: all (this CPU must run them)")
    parser.add_argument("--base", help="git revision whose kernel headers to compare against, alternated")
    parser.add_argument("--base-isa", choices=sorted(FLAGS),
                        help="build --base for this ISA instead of --isa (e.g. avx512vbmi against a revision that "
                             "only has avx512vnni; --base HEAD --base-isa X: this tree's ISA X against --isa)")
    parser.add_argument("--rounds", type=int, default=3, help="alternated runs of each build (with --base)")
    parser.add_argument("--stream-mib", type=int, default=0,
                        help="stream the one-row GEMV from ~MIB MiB of weights per thread (2 MiB pages)")
    parser.add_argument("--calls", type=int, default=0,
                        help="with --stream-mib: the threads share the copies, each copy one call split in CALLS "
                             "equal tasks a thread (task i on thread i %% T) with a barrier after it: a decode step's "
                             "GEMVs (the plugin's default split is 4)")
    parser.add_argument("--threads", default="1", help="comma-separated thread counts (with --stream-mib)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="with --stream-mib: cpu = each pass timed by its slowest thread's CPU time, the tiles' "
                             "best pass and the probe's (a busy machine: without the time a thread was descheduled)")
    parser.add_argument("--formats", default="", help="comma-separated formats to run (default: all)")
    parser.add_argument("--env", action="append",
                        help="with --stream-mib: an arm of this tree with these variables set (A=1,B=2), repeatable "
                             "(default: one arm as it is)")
    parser.add_argument("--base-env", action="append", help="the same for --base")
    parser.add_argument("--phase-gbs", type=float, default=0.0,
                        help="with --stream-mib: each round between its own probes, printed, and summed up per phase "
                             "of the memory: 'fast' rounds with both probes above this GB/s")
    parser.add_argument("--slow-gbs", type=float, default=48.0,
                        help="with --phase-gbs: 'slow' rounds have both probes below this GB/s")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    base = base_headers(args.base) if args.base else None
    if args.stream_mib > 0:
        stream(args, base)
        print(f"load average {os.getloadavg()[0]:.2f}")
        return
    for isa in args.isa or sorted(FLAGS):
        new_exe = build(isa, INCLUDE)
        if base is None:
            print(f"{isa}:", flush=True)
            print("\n".join(describe(run(new_exe, args.n, args.k, args.reps))), flush=True)
            continue
        base_exe = build(args.base_isa or isa, base)
        news, bases = [], []
        for _ in range(args.rounds):
            bases.append(run(base_exe, args.n, args.k, args.reps))
            news.append(run(new_exe, args.n, args.k, args.reps))
        new, old = median_of(news), median_of(bases)
        print(f"{isa} base {args.base}{' ' + args.base_isa if args.base_isa else ''}:")
        print("\n".join(describe(old)))
        print(f"{isa} this tree:")
        print("\n".join(describe(new)))
        print(f"{isa} this tree / base (time):")
        for fmt, (_, _, _, t1, digest, ms) in new.items():
            o = old[fmt]
            cols = [f"M={m} {tm / o[5][m]:.2f}" for m, tm in ms.items()]
            same = "same bits" if digest == o[4] else "other bits"
            print(f"  {fmt}: M=1 {t1 / o[3]:.2f} | " + " | ".join(cols) + f" | M=1 output {same} as base", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
