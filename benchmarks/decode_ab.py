"""Two builds of hetero decoding side by side on a busy machine: two resident processes (this checkout or another
tree, each with optional environment settings) take turns running short blocks of decode steps of one GGUF file.

    python benchmarks/decode_ab.py MODEL.gguf /tmp/base-tree --threads 2 --blocks 30 --steps 6
    python benchmarks/decode_ab.py MODEL.gguf .:HETERO_LLM_HUGE=0 --threads 1     # this checkout, a setting off
    python benchmarks/decode_ab.py MODEL.gguf /tmp/base-tree --threads 1 --clock cpu  # CPU time per step

Unlike ``decode_threads.py --against`` (a fresh process per round), both models stay loaded and the turns are a few
steps long, so both arms see the same neighbours within seconds of each other: each block pair gives a ratio, and
the script prints the median of those ratios (arm B's step time over arm A's: > 1 means A is faster) beside each
arm's minimum, 10th percentile and median step. On a machine shared with other work the median step measures the
neighbours; the minimum and 10th percentile are the steps that had the cores. Each step decodes one token after
``--prompt`` cached tokens (rolled back each step, so every step sees the same context); with ``--prefill N`` a step
is instead a prefill of N tokens into an empty cache. Before timing, each arm hashes the float32 logits of a
prefill (of ``--prefill`` tokens, or the prompt) and of 16 greedy decode steps after the prompt; the script says
whether the two arms' logits are bit-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

from resident import Resident, WorkerError, turn_order

ROOT = Path(__file__).resolve().parents[1]


def worker(tree: Path, model: str, threads: int, prompt: int, prefill: int, clock: str = "wall") -> int:
    """Loads the model from ``tree``, then for each line "N" of stdin runs N steps (decode steps, or prefills of
    ``prefill`` tokens) and prints their seconds."""
    sys.path[:0] = [str(tree / "core"), str(tree / "plugins" / "cpu")]
    import hetero_cpu
    from hetero.llm import load

    if not Path(hetero_cpu.__file__).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"decode_ab: {tree} did not provide hetero_cpu ({hetero_cpu.__file__})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = load(model, backends=["cpu"], on_fallback="silent", threads=threads, context=max(prompt, prefill) + 32,
                   progress=False)
    ids = list(range(100, 100 + max(prompt, prefill) + 16))
    digest = hashlib.sha256()  # the logits of a prefill and of greedy decode steps: equal builds hash equal
    if prefill:
        digest.update(llm.prefill(ids[:prefill])[-1].astype("<f4").tobytes())
        llm.rollback(0)
    digest.update(llm.prefill(ids[:prompt])[-1].astype("<f4").tobytes())
    token = ids[prompt]
    for _ in range(16):
        logits = llm.forward([token])[-1]
        digest.update(logits.astype("<f4").tobytes())
        token = int(logits.argmax())
    for _ in range(4):  # the replay of a one-token step is recorded
        llm.rollback(prompt)
        llm.forward([ids[prompt]])
    print("ready", digest.hexdigest()[:16], flush=True)
    now = time.perf_counter if clock == "wall" else time.process_time
    for line in sys.stdin:
        times = []
        for i in range(int(line)):
            llm.rollback(0 if prefill else prompt)
            t0 = now()
            if prefill:
                llm.prefill(ids[:prefill])
            else:
                llm.forward([ids[prompt + 1 + i % 8]])
            times.append(now() - t0)
        print(json.dumps(times), flush=True)
    return 0


def spawn(arm: str, args: argparse.Namespace) -> tuple[Resident, str]:
    """The arm's worker, loaded, and the hash of its logits."""
    tree, _, settings = arm.partition(":")
    env = {**os.environ, **dict(kv.split("=", 1) for kv in settings.split(",") if kv)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(Path(tree).resolve()), args.model,
           "--threads", str(args.threads), "--prompt", str(args.prompt), "--prefill", str(args.prefill),
           "--clock", args.clock]
    try:
        worker = Resident(arm, cmd, env, ready_timeout=args.timeout)
    except WorkerError as err:
        raise SystemExit(f"decode_ab: the {arm} worker failed to start: {err}") from None
    return worker, worker.ready


def run_block(worker: Resident, steps: int, timeout: float | None = None) -> list[float]:
    return [float(t) for t in json.loads(worker.ask(str(steps), timeout))]


def quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[int(q * (len(v) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a .gguf file")
    ap.add_argument("against", nargs="?", help="arm B: TREE[:NAME=VALUE,...] (arm A is this checkout, or --a)")
    ap.add_argument("--a", default=str(ROOT), help="arm A: TREE[:NAME=VALUE,...] (default: this checkout)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=30, help="block pairs (the order alternates)")
    ap.add_argument("--steps", type=int, default=6, help="decode steps per block")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--prefill", type=int, default=0, help="time prefills of this many tokens instead of decode steps")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: the process's CPU time per step instead of wall time (1 thread on a busy machine: the "
                         "step without the time it was descheduled; at 2+ threads it also counts the workers' spins)")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds a worker may take to load, or to answer one block, before it is abandoned")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.model, args.threads, args.prompt, args.prefill, args.clock)
    if not args.against:
        ap.error("the second arm (against) is required")
    arms = [args.a, args.against]
    procs, digests = zip(*(spawn(arm, args) for arm in arms), strict=True)
    load_before = os.getloadavg()[0]
    times: list[list[float]] = [[], []]
    ratios = []
    try:
        for b in range(args.blocks):
            med = [0.0, 0.0]
            for i in turn_order(b):
                block = run_block(procs[i], args.steps, args.timeout)
                times[i] += block
                med[i] = statistics.median(block)
            ratios.append(med[1] / med[0])
    except WorkerError as err:
        raise SystemExit(f"decode_ab: {err}") from None
    finally:
        for p in procs:
            p.close()
    load_after = os.getloadavg()[0]
    rows = [dict(arm=arm, min_ms=min(t) * 1e3, p10_ms=quantile(t, 0.1) * 1e3, median_ms=statistics.median(t) * 1e3)
            for arm, t in zip(arms, times, strict=True)]
    summary = dict(model=Path(args.model).name, threads=args.threads, prompt=args.prompt, prefill=args.prefill,
                   blocks=args.blocks,
                   steps=args.steps, clock=args.clock, load_avg=[load_before, load_after], arms=rows,
                   ratio_median=statistics.median(ratios), ratio_p10=rows[1]["p10_ms"] / rows[0]["p10_ms"],
                   ratio_min=rows[1]["min_ms"] / rows[0]["min_ms"], logits_identical=digests[0] == digests[1])
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    what = f"prefills of {args.prefill} tokens" if args.prefill else f"steps after {args.prompt} tokens"
    print(f"{summary['model']}, {args.threads} thread(s), {args.blocks} x 2 alternating blocks of {args.steps} {what}"
          f"{' (CPU time)' if args.clock == 'cpu' else ''}; "
          f"load average {load_before:.2f} -> {load_after:.2f}")
    print("| arm | min ms | p10 ms | median ms |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['arm']} | {r['min_ms']:.2f} | {r['p10_ms']:.2f} | {r['median_ms']:.2f} |")
    print(f"B / A step time: median of block ratios {summary['ratio_median']:.3f}, p10 {summary['ratio_p10']:.3f}, "
          f"min {summary['ratio_min']:.3f} (> 1: A faster)")
    print("logits (a prefill and 16 greedy steps):",
          "bit-identical" if digests[0] == digests[1] else f"DIFFER ({digests[0]} vs {digests[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
