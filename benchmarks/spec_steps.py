"""Where a speculative run's time goes, step by step: ``hetero bench --spec`` with the per-step log
(``hetero.llm.steplog``) and the cpu thread pool's statistics of every step, then a summary per run.

    PYTHONPATH=core:plugins/cpu python benchmarks/spec_steps.py -m qwen2.5-coder-1.5b.gguf -t 2 -r 5 --log steps.jsonl
    PYTHONPATH=core:plugins/cpu python benchmarks/spec_steps.py --summary steps.jsonl      # an earlier log again

Per run (plain or speculative, in the bench's alternated order): tokens/s, the steps by width (tokens scored)
with their median milliseconds (the verify pass alone: a draft model's drafting is given apart, per draft
token), the plain steps a speculative run took (before a plain step was warm, probes,
drafting switched off or cut to nothing), how often the policy switched drafting off, and the pool's joins that
began asleep (a worker woken through the condition variable) per step of each kind.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def run(args: argparse.Namespace) -> None:
    import hetero.llm
    from hetero.llm import steplog
    from hetero.llm.speculative.bench import bench_speculative, spec_table

    os.environ[steplog.ENV] = str(args.log)
    if args.pool:
        from hetero_cpu import _native

        _native.pool_stats_enable(True)

        def probe() -> dict[str, Any]:
            s = _native.pool_stats(True)
            return {"pool_calls": s["calls"], "pool_sleeps": s["sleeps"], "pool_joins": s["joins"],
                    "pool_wake_ms": round(1e3 * s["wake_s"], 3), "pool_tail_ms": round(1e3 * s["tail_s"], 3)}

        steplog.set_probe(probe)
    for threads in args.threads:
        llm = hetero.llm.load(args.model, backends=["cpu"], on_fallback="silent", threads=threads, context=2048)
        results = bench_speculative(llm, args.spec, n_gen=args.n, repetitions=args.repetitions, threads=threads,
                                    prompts=tuple(args.prompts))
        print(spec_table(results), flush=True)
        llm.close()


def summary(path: Path) -> None:
    runs: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        e = json.loads(line)
        if e["kind"] == "run":
            current = {**e, "steps": []}
            runs.append(current)
        elif e["kind"] in ("plain", "spec") and current is not None:
            current["steps"].append(e)
    print("| prompt | threads | rep | run | tokens | s | tok/s | steps by width: count x median ms (verify pass; "
          "draft ms per token) | plain steps in "
          "spec (cold / probe / off / cut) | switched off | drafting loss | asleep joins per step (plain / verify) |")
    print("|---|---|---|---|---:|---:|---:|---|---|---:|---:|---|")
    for r in runs:
        steps = [s for s in r["steps"] if s["kind"] == ("plain" if r["drafter"] == "plain" else "spec")]
        if not steps or r["drafter"] == "warm-up":
            continue
        seconds = sum(s["seconds"] for s in steps)
        tokens = sum(s.get("committed", 1) for s in steps)
        by_width: dict[int, list[float]] = defaultdict(list)
        drafting: list[float] = []  # ms per drafted token (drafters whose drafts cost time: a draft model)
        for s in steps:
            draft_ms = 1e3 * s.get("draft_seconds", 0.0)
            if s.get("drafted", 0) and draft_ms > 0:
                drafting.append(draft_ms / s["drafted"])
            by_width[s.get("drafted", 0) + 1].append(1e3 * s["seconds"] - draft_ms)  # the verify pass alone
        widths = " ".join(f"{w}:{len(v)}x{statistics.median(v):.1f}" for w, v in sorted(by_width.items()))
        if drafting:
            widths += f" draft:{len(drafting)}x{statistics.median(drafting):.1f}/token"
        plain_in_spec = "-"
        off = loss = "-"
        if r["drafter"] != "plain":
            loss = drafting_loss(steps)
            plain = [s for s in steps if s.get("drafted", 0) == 0]
            cold = sum(1 for s in plain if s["asked"] == 0 and s["produced"] <= 4)
            probe = sum(1 for s in plain if s["asked"] == 0 and s["produced"] > 4 and s["produced"] >= s["off_until"])
            switched = sum(1 for s in plain if s["asked"] == 0 and s["produced"] < s["off_until"])
            cut = sum(1 for s in plain if s["asked"] > 0)
            plain_in_spec = f"{len(plain)} ({cold} / {probe} / {switched} / {cut})"
            off = str(steps[-1]["switched_off"])
        asleep = [f"{statistics.mean(s.get('pool_sleeps', 0) for s in group):.2f}" if group else "-"
                  for group in ([s for s in steps if s.get("drafted", 0) == 0],
                                [s for s in steps if s.get("drafted", 0) > 0])]
        print(f"| {r['prompt']} | {r['threads']} | {r['repetition']} | {r['drafter']} | {tokens} | {seconds:.2f} | "
              f"{tokens / seconds:.2f} | {widths} | {plain_in_spec} | {off} | {loss} | {' / '.join(asleep)} |")


def drafting_loss(steps: list[dict[str, Any]]) -> str:
    """What a run's drafting steps cost beyond plain decoding, in % of the run's tokens at the plain step's
    seconds: the sum over drafting steps of (seconds - committed tokens x a plain step), the plain step being the
    median of the run's own warm plain steps (the same moment of a shared machine; a paired plain run met
    another). Negative: drafting gained. Then the number of drafting steps."""
    plain = [s["seconds"] for s in steps if s.get("drafted", 0) == 0 and s["produced"] > 4]
    drafting = [s for s in steps if s.get("drafted", 0) > 0]
    if not plain:
        return f"? ({len(drafting)})"
    step = statistics.median(plain)
    tokens = sum(s.get("committed", 1) for s in steps)
    extra = sum(s["seconds"] - s["committed"] * step for s in drafting)
    return f"{100 * extra / (tokens * step):+.1f}% ({len(drafting)})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", type=Path)
    p.add_argument("--spec", action="append", default=None)
    p.add_argument("-t", "--threads", type=int, action="append", default=None)
    p.add_argument("-n", type=int, default=64)
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("--prompts", nargs="*", default=["code", "chat"])
    p.add_argument("--log", type=Path, default=Path("spec_steps.jsonl"))
    p.add_argument("--no-pool", dest="pool", action="store_false", help="without the pool's statistics")
    p.add_argument("--summary", type=Path, help="only summarize this log")
    args = p.parse_args()
    if args.summary:
        summary(args.summary)
        return
    if args.model is None:
        p.error("-m MODEL (or --summary LOG)")
    args.spec = args.spec or ["lookahead"]
    args.threads = args.threads or [2]
    if args.log.exists():
        args.log.unlink()
    run(args)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    summary(args.log)


if __name__ == "__main__":
    main()
