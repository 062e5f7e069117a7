"""Decode speed after what comes before it, in one hetero process: a tg run right after another tg run (warm),
right after a prefill, after the process slept, and after another process streamed memory.

    python benchmarks/decode_after.py MODEL.gguf --threads 1 --rounds 8 [--tg 128] [--pp 512] [--idle 3]
    python benchmarks/decode_after.py MODEL.gguf --conditions warm,pp --clock cpu --probe --json

Issue 20: in ``benchmarks/llm.py --pairs`` (each engine: one pp512 then one tg128 per round, the other engine
streaming its own weights in between) hetero's tg128 ran 10-20 % slower than in the sequential mode. This script
separates the causes. Each round runs every condition once, in an order rotated round by round (a drift of the
machine's load hits each condition alike); a condition is what runs just before one timed tg run:

* ``warm``: nothing (the run before it was a tg run);
* ``pp``: a prefill of ``--pp`` tokens into an empty cache (its seconds kept as ``setup_s``, as each condition's);
* ``sleep``: ``time.sleep(--idle)``;
* ``stream``: a second process reads a numpy buffer of ``--stream-mib`` MiB (2 GiB) over and over for ``--idle``
  seconds (the other engine of a --pairs round; this process waits for it to end).

A tg run is ``hetero.llm.bench.run_test``'s (reset, one untimed token, then ``--tg`` one-token steps), timed step by
step, in wall time and in the process's CPU time (``--clock`` picks which the ratios use; at 1 thread on a busy
machine the CPU time leaves out the time the process was descheduled but keeps its memory stalls). The summary per
condition: the median over rounds of (that round's tg time / the same round's warm tg time),
the same ratio for the first 8 steps and for the rest (a one-time cost shows in the first, a lasting one in both),
and the minor / major page faults (``getrusage``) of the tg run and of what ran before it. On a shared machine
quote the ratios, not the t/s, with the load average printed beside them. ``--probe``: a short read-bandwidth probe
after each tg run (``probe_gbps`` in the JSON) and one before the first, to tell a run that met a slower phase of the
VM's memory from one that hetero made slower: each run's "before" is the probe that came before it
(``probe_before_gbps``: right before it for a ``warm`` run, before its condition otherwise), and, as in
``llm.py --pairs``, each run reads (t/s x the bytes a step reads, ``llm.py``'s ``file_stats``) some % of the mean of
its two probes, the run flagged "phase changed" where they differ by > 15 %. Per condition: the median of that %,
the same over the runs whose probes agree, and its minimum there (is hetero's step ever far below the probes
beside it within one phase?). ``--conditions warm --probe``: every run right between two probes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # once: its siblings (read_bandwidth, llm), imported lazily


def _llm_bench() -> Any:
    """The sibling benchmarks/llm.py, loaded once by its path: ``import llm`` may find another module of that name
    first (under pytest, the tests' ``llm`` package)."""
    import importlib.util

    name = "hetero_benchmarks_llm"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name("llm.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


CONDITIONS = ("warm", "pp", "sleep", "stream")
HEAD = 8  # steps counted as "the first steps" of a tg run

# The second process of the "stream" condition: a buffer of argv[2] MiB (touched) read for argv[1] seconds.
STREAM_SRC = """
import sys, time
import numpy as np
a = np.ones(int(sys.argv[2]) << 17)  # float64
end = time.perf_counter() + float(sys.argv[1])
while time.perf_counter() < end:
    a.sum()
"""


def faults() -> tuple[int, int]:
    """(minor, major) page faults of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_majflt


def tg_steps(llm: Any, n_gen: int, vocab: int, rng: Any) -> tuple[list[float], list[float]]:
    """``run_test(llm, 0, n_gen)`` with each step's seconds, wall and CPU (the process's, all threads: without the
    time it was descheduled): reset, one untimed token, then the timed steps."""
    llm.reset()
    llm.forward([int(rng.integers(vocab))])
    wall, cpu = [], []
    for token in rng.integers(0, vocab, size=n_gen).tolist():
        t0, c0 = time.perf_counter(), time.process_time()
        llm.forward([token])
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def anon_huge_kib() -> int:
    """This process's anonymous memory on transparent huge pages (KiB; 0 where /proc is not Linux's)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("AnonHugePages:")), 0)
    except OSError:
        return 0


def stream(seconds: float, mib: int = 2048) -> None:
    """Another process streaming memory for ``seconds`` (after its ``mib`` MiB are allocated and touched)."""
    subprocess.run([sys.executable, "-c", STREAM_SRC, str(seconds), str(mib)], check=True)


def probe(threads: int) -> dict[str, float]:
    """A short read-bandwidth probe at ``threads`` threads (benchmarks/read_bandwidth.py, ~0.5 s): the machine's
    memory speed right after a tg run, to tell a slower run in a slower phase of the VM from one that hetero made
    slower. {"best": GB/s by the wall clock, "best_cpu": the same passes by CPU time}."""
    from read_bandwidth import measure

    return measure([threads], mib=64, reps=4, rounds=1)[threads]


def own_bound(runs: dict[str, list[dict[str, Any]]], bytes_per_token: int) -> dict[str, dict[str, Any]]:
    """Per condition, its runs against their own probes (``probe_before_gbps``, ``probe_gbps``): ``llm.py``'s
    ``own_bound_summary`` of ``bracketed_runs`` (wall t/s; with the probes' CPU-clock figures where kept), plus
    "pct_steady_min": the lowest % of own bound among the runs whose probes agree and did not lose the CPU (None if
    none)."""
    bracketed_runs, own_bound_summary = _llm_bench().bracketed_runs, _llm_bench().own_bound_summary

    out: dict[str, dict[str, Any]] = {}
    for cond, rs in runs.items():
        cpu = ([[r["probe_before_cpu_gbps"], r["probe_cpu_gbps"]] for r in rs]
               if all("probe_cpu_gbps" in r for r in rs) else None)
        bracketed = bracketed_runs([len(r["steps"]) / sum(r["steps"]) for r in rs],
                                   [[r["probe_before_gbps"], r["probe_gbps"]] for r in rs], bytes_per_token, cpu)
        steady = [b["pct"] for b in bracketed if not b["phase_changed"] and not b["lost_cpu"]]
        out[cond] = {**own_bound_summary(bracketed), "pct_steady_min": min(steady) if steady else None,
                     "runs": bracketed}
    return out


def rotated(conditions: Sequence[str], r: int) -> list[str]:
    """The round's order: the conditions rotated by the round index."""
    k = r % len(conditions)
    return list(conditions[k:]) + list(conditions[:k])


def summarize(runs: dict[str, list[dict[str, Any]]], clock: str = "wall", head: int = HEAD
              ) -> dict[str, dict[str, float]]:
    """Per condition: medians over the rounds of its tg time over the same round's warm tg time (all steps, the
    first ``head``, the rest; ``clock`` "wall" or "cpu": which step times), its t/s (median, wall), and the median
    faults of the run and of what came before it."""
    key = "steps" if clock == "wall" else "cpu_steps"
    warm = runs["warm"]
    out: dict[str, dict[str, float]] = {}
    for cond, rs in runs.items():
        def ratio(part: Callable[[list[float]], list[float]], rs: list[dict[str, Any]] = rs) -> float:
            pairs = [(sum(part(a[key])), sum(part(w[key]))) for a, w in zip(rs, warm, strict=True)]
            ratios = [x / y for x, y in pairs if y > 0]  # none: a run of no more than ``head`` steps has no rest
            return statistics.median(ratios) if ratios else float("nan")

        out[cond] = {
            "ts": statistics.median(len(r["steps"]) / sum(r["steps"]) for r in rs),
            "ratio": ratio(lambda s: s),
            "ratio_head": ratio(lambda s: s[:head]),
            "ratio_rest": ratio(lambda s: s[head:]),
            "first_ms": statistics.median(r[key][0] for r in rs) * 1e3,
            "minflt": statistics.median(r["minflt"] for r in rs),
            "majflt": statistics.median(r["majflt"] for r in rs),
            "before_minflt": statistics.median(r["before_minflt"] for r in rs),
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a .gguf file")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tg", type=int, default=128, help="steps of a tg run")
    ap.add_argument("--pp", type=int, default=512, help="tokens of the prefill before a 'pp' run")
    ap.add_argument("--idle", type=float, default=3.0, help="seconds of the 'sleep' and 'stream' conditions")
    ap.add_argument("--stream-mib", type=int, default=2048, help="the buffer the 'stream' process reads")
    ap.add_argument("--conditions", default=",".join(CONDITIONS), help=f"comma-separated, of {CONDITIONS}")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="the step times the ratios compare: wall, or the process's CPU time (on a busy machine: "
                         "without the time it was descheduled; at 2+ threads it also counts the workers' spins)")
    ap.add_argument("--probe", action="store_true",
                    help="a short read-bandwidth probe after each tg run (kept as probe_gbps; it is what the next "
                         "condition follows, so warm then means 'after a tg run and a probe')")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    conditions = [c for c in args.conditions.split(",") if c]
    if "warm" not in conditions or any(c not in CONDITIONS for c in conditions):
        ap.error(f"--conditions: of {CONDITIONS}, warm included")

    import numpy as np

    import hetero_cpu
    from hetero.llm import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = load(args.model, backends=["cpu"], on_fallback="silent", threads=args.threads,
                   context=args.pp + args.tg + 8, progress=False)
    vocab = llm.config.vocab_size
    rng = np.random.default_rng(args.seed)
    def prefill() -> None:
        llm.reset()
        llm.prefill(rng.integers(0, vocab, size=args.pp).tolist())

    before: dict[str, Callable[[], None]] = {
        "warm": lambda: None,
        "pp": prefill,
        "sleep": lambda: time.sleep(args.idle),
        "stream": lambda: stream(args.idle, args.stream_mib),
    }
    prefill()  # warm-up: a prefill and a tg run (the replay of a one-token step recorded)
    tg_steps(llm, args.tg, vocab, rng)
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in conditions}
    last_probe = probe(args.threads) if args.probe else {}
    for r in range(args.rounds):
        for cond in rotated(conditions, r):
            f0 = faults()
            t0 = time.perf_counter()
            before[cond]()
            setup_s = time.perf_counter() - t0
            f1 = faults()
            steps, cpu_steps = tg_steps(llm, args.tg, vocab, rng)
            f2 = faults()
            runs[cond].append({"steps": steps, "cpu_steps": cpu_steps, "setup_s": setup_s,
                               "before_minflt": f1[0] - f0[0], "minflt": f2[0] - f1[0], "majflt": f2[1] - f1[1],
                               "anon_huge_kib": anon_huge_kib()})
            if args.probe:
                now = probe(args.threads)
                runs[cond][-1].update(probe_before_gbps=last_probe["best"], probe_gbps=now["best"])
                if "best_cpu" in now and "best_cpu" in last_probe:
                    runs[cond][-1].update(probe_before_cpu_gbps=last_probe["best_cpu"], probe_cpu_gbps=now["best_cpu"])
                last_probe = now
    load_after = os.getloadavg()[0]
    summary = summarize(runs, args.clock)
    doc = {"model": os.path.basename(args.model), "threads": args.threads, "rounds": args.rounds, "tg": args.tg,
           "pp": args.pp, "idle": args.idle, "clock": args.clock,
           "load_avg": [load_before, load_after], "hetero_cpu": hetero_cpu.__file__,
           "summary": summary, "runs": runs}
    if args.probe:
        doc["bytes_per_token"] = _llm_bench().file_stats(Path(args.model), args.tg)["bytes_per_token"]
        doc["own_bound"] = own_bound(runs, doc["bytes_per_token"])
    if args.json:
        print(json.dumps(doc))
        return 0
    print(f"{doc['model']}, {args.threads} thread(s), {args.rounds} rounds of tg{args.tg} after each condition "
          f"(pp{args.pp}, idle {args.idle:g} s; {args.clock} clock); "
          f"load average {load_before:.2f} -> {load_after:.2f}; "
          f"{hetero_cpu.__file__}")
    print("| before the tg run | t/s | time / warm | first 8 steps / warm | rest / warm | first step ms | "
          "minor faults (tg) | major (tg) | minor faults (before) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cond, s in summary.items():
        print(f"| {cond} | {s['ts']:.1f} | {s['ratio']:.3f} | {s['ratio_head']:.3f} | {s['ratio_rest']:.3f} | "
              f"{s['first_ms']:.1f} | {s['minflt']:.0f} | {s['majflt']:.0f} | {s['before_minflt']:.0f} |")
    if args.probe:
        print(f"\nAgainst the probes beside each run ({doc['bytes_per_token'] / 1e6:.1f} MB a step):")
        print("| before the tg run | read GB/s | own probes GB/s | % of own-probe bound | same, probes agree | "
              "lowest, probes agree | phase changed | lost CPU | probes: before -> after (GB/s), t/s, % each run |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for cond, o in doc["own_bound"].items():
            each = "; ".join(f"{b['probes'][0]:.1f} -> {b['probes'][1]:.1f}, {b['ts']:.1f}, {b['pct']:.0f}"
                             + ("*" if b["phase_changed"] else "") + ("!" if b["lost_cpu"] else "")
                             for b in o["runs"])
            print(f"| {cond} | {o['read_gbs']:.1f} | {o['bound']:.1f} | {o['pct']:.0f} | {_pct(o['pct_steady'])} | "
                  f"{_pct(o['pct_steady_min'])} | {o['phase_changed']} of {o['n']} | {o['lost_cpu']} | {each} |")
        print("(* phase changed: the run's two probes differ by > 15 %; ! lost CPU: a probe beside it read > 15 % "
              "faster by CPU time than by the wall clock; 'probes agree' leaves both out)")
    return 0


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


if __name__ == "__main__":
    sys.exit(main())
