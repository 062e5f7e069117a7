"""What a draft model's draft token costs, in decode steps of its target: several ``--spec draft:...`` variants
(the re-quantized draft against ``quant=none``, draft vocabularies...) each draft 10 tokens from the bench's code
prompt, alternated with each other and with one decode step of the target, ``-r`` rounds; prints each variant's
median milliseconds per draft token, that over the target's median decode step, the median per-round ratio to the
first variant, and the drafts themselves (a cheaper variant that drafts other tokens may be accepted less: the
speed-up itself is ``hetero bench --spec``'s).

    PYTHONPATH=core:plugins/cpu python benchmarks/draft_cost.py -m qwen2.5-coder-1.5b.gguf \\
        --spec draft:sns-0.5b.gguf --spec draft:sns-0.5b.gguf,quant=none -t 2 -r 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

DRAFT = 10


def measure(model: str, specs: list[str], threads: int, rounds: int) -> None:
    import hetero.llm
    from hetero.llm.speculative.bench import CODE_PROMPT
    from hetero.llm.speculative.registry import make_drafter

    llm = hetero.llm.load(model, backends=["cpu"], on_fallback="silent", threads=threads, context=1024)
    drafters = [make_drafter(spec, llm) for spec in specs]
    ids = llm.tokenize(CODE_PROMPT)
    llm.prefill(ids)
    for d in drafters:
        d.begin(ids, {})

    def step() -> float:
        llm.rollback(len(ids) - 1)
        started = time.perf_counter()
        llm.forward(ids[-1:])
        return time.perf_counter() - started

    def draft(d) -> tuple[float, list[int]]:
        d.model.rollback(len(ids) - 1)  # the prompt's last token and 9 more: as after a verify step
        started = time.perf_counter()
        out = d.draft(ids, DRAFT)
        return (time.perf_counter() - started) / DRAFT, out

    steps: list[float] = []
    seconds: list[list[float]] = [[] for _ in specs]
    drafts: list[list[int]] = [[] for _ in specs]
    for r in range(rounds):
        order = list(range(len(specs)))
        order = order[r % len(order):] + order[:r % len(order)]
        steps.append(step())
        for i in order:
            s, drafts[i] = draft(drafters[i])
            seconds[i].append(s)
    plain = statistics.median(steps)
    print(f"target decode step {1e3 * plain:.1f} ms (median of {rounds}), {threads} thread(s)")
    print("| draft | ms / draft token | target steps | vs first | drafts |")
    print("|---|---:|---:|---:|---|")
    for spec, times, out in zip(specs, seconds, drafts, strict=True):
        ratio = statistics.median(a / b for a, b in zip(times, seconds[0], strict=True))
        print(f"| {spec} | {1e3 * statistics.median(times):.2f} | {statistics.median(times) / plain:.3f} | "
              f"{ratio:.3f} | {out} |")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", required=True, help="the target model")
    p.add_argument("--spec", action="append", required=True, help="draft:PATH[,options] (several: compared)")
    p.add_argument("-t", "--threads", type=int, action="append", default=None)
    p.add_argument("-r", "--rounds", type=int, default=15)
    args = p.parse_args()
    for threads in args.threads or [2]:
        measure(args.model, args.spec, threads, args.rounds)


if __name__ == "__main__":
    main()
