"""What a speculative verify step of k tokens costs against a one-token decode step of the same model: ``Llm.verify``
of the last k tokens of the bench's code prompt (the cache rolled back to just before them, so every step sees the
same context), k = 1..K in a rotating order each round, ``-r`` rounds; prints per k the median milliseconds and
the median over rounds of cost(k) / cost(1) measured in the same round. ``--clock cpu`` (the default) times the
process's CPU time (every thread of the pool; a spinning worker counts), ``wall`` the elapsed time.

``--tree DIR`` (repeatable) runs the same measurement against other source trees' ``core`` and ``plugins/cpu`` in
subprocesses alternated round by round with this one (an interleaved A/B: the machine's drift hits both alike).

    PYTHONPATH=core:plugins/cpu python benchmarks/verify_cost.py -m qwen2.5-coder-1.5b.gguf -t 1 -t 2 -r 9 [--k 12]
    PYTHONPATH=core:plugins/cpu python benchmarks/verify_cost.py -m ... --tree /tmp/base-tree -r 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(model: str, threads: int, kmax: int, rounds: int, clock: str) -> dict[int, list[float]]:
    """Seconds of each k-token verify step per round (in this process's tree)."""
    import hetero.llm
    from hetero.llm.speculative.bench import CODE_PROMPT

    llm = hetero.llm.load(model, backends=["cpu"], on_fallback="silent", threads=threads, context=1024)
    ids = llm.tokenize(CODE_PROMPT)
    llm.prefill(ids)
    now = time.process_time if clock == "cpu" else time.perf_counter
    ks = list(range(1, kmax + 1))

    def step(k: int) -> float:
        llm.rollback(len(ids) - k)
        started = now()
        llm.verify(ids[-k:])
        return now() - started

    for k in ks:  # record each size's replay (the first steps of a size build its plan)
        for _ in range(3):
            step(k)
    out: dict[int, list[float]] = {k: [] for k in ks}
    for r in range(rounds):
        for k in ks[r % kmax:] + ks[:r % kmax]:
            out[k].append(step(k))
    llm.close()
    return out


def table(name: str, runs: dict[int, list[float]]) -> str:
    ones = runs[1]
    lines = [f"{name}", "| k | ms (median) | cost(k) / cost(1) |", "|---:|---:|---:|"]
    for k, secs in runs.items():
        ratio = statistics.median(a / b for a, b in zip(secs, ones, strict=True))
        lines.append(f"| {k} | {1e3 * statistics.median(secs):.2f} | {ratio:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, action="append", default=None)
    ap.add_argument("-r", "--rounds", type=int, default=9)
    ap.add_argument("--k", type=int, default=12, help="the largest step (tokens)")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    ap.add_argument("--tree", action="append", default=[], help="another source tree, alternated with this one")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    threads = args.threads or [2]
    if args.worker:  # one round in a subprocess: JSON on stdout
        print(json.dumps(worker(args.model, threads[0], args.k, args.rounds, args.clock)))
        return
    trees = [HERE.parent, *(Path(t).resolve() for t in args.tree)]
    for t in threads:
        runs: list[dict[int, list[float]]] = [{k: [] for k in range(1, args.k + 1)} for _ in trees]
        for r in range(args.rounds):
            order = list(range(len(trees)))
            order = order[r % len(order):] + order[:r % len(order)]
            for i in order:
                tree = trees[i]
                env = {**os.environ, "PYTHONPATH": f"{tree / 'core'}:{tree / 'plugins' / 'cpu'}"}
                res = subprocess.run([sys.executable, str(HERE / "verify_cost.py"), "--worker", "1", "-m", args.model,
                                      "-t", str(t), "-r", "3", "--k", str(args.k), "--clock", args.clock],
                                     env=env, check=True, capture_output=True, text=True)
                for k, secs in json.loads(res.stdout.strip().splitlines()[-1]).items():
                    runs[i][int(k)].extend(secs)
        for tree, res_ in zip(trees, runs, strict=True):
            print(table(f"{tree} ({t} thread(s), {args.clock} clock, {args.rounds} x 3 rounds)", res_), flush=True)
        if len(trees) > 1:
            print("| k | " + " | ".join(f"{tr.name} / {trees[0].name}" for tr in trees[1:]) + " |")
            print("|---:|" + "---:|" * (len(trees) - 1))
            for k in range(1, args.k + 1):
                cells = [f"{statistics.median(a / b for a, b in zip(runs[i][k], runs[0][k], strict=True)):.3f}"
                         for i in range(1, len(trees))]
                print(f"| {k} | " + " | ".join(cells) + " |")
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
