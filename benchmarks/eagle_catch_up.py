"""What an Eagle-3 trial costs after a pause in drafting, in decode steps of its target: the head catching up over
the rows the target decoded while drafting was off (``accept`` of those rows, then a one-token ``draft``), for
pauses of ``--pauses`` tokens, with the drafter's ``catch_up`` window and without one (every row since the last
draft), alternated with a decode step of the target, ``-r`` rounds; prints the median milliseconds and their ratio
to the median decode step.

    PYTHONPATH=core:plugins/cpu python benchmarks/eagle_catch_up.py -m sns-0.5b.gguf --eagle DIR -t 2 -t 1 -r 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any


def measure(model: str, eagle: str, threads: int, pauses: list[int], rounds: int) -> None:
    import hetero.llm
    from hetero.llm.speculative.bench import CODE_PROMPT
    from hetero.llm.speculative.eagle import Eagle3Drafter

    llm = hetero.llm.load(model, backends=["cpu"], on_fallback="silent", threads=threads, context=1024)
    variants = {"window": Eagle3Drafter.for_target(eagle, llm),
                "all rows": Eagle3Drafter.for_target(eagle, llm, catch_up=1 << 20)}
    layers = llm.expose_hidden(variants["window"].hidden_layers)
    prompt = llm.tokenize(CODE_PROMPT)
    llm.generate(CODE_PROMPT, max(pauses) + 1, temperature=0)
    history = prompt + list(llm.last.tokens)
    end = len(history) - 1  # the target's cache holds the rows of history[:end]

    def rows(start: int, stop: int) -> dict[int, Any]:
        return {layer: llm.hidden(layer, start, stop) for layer in layers}

    def step() -> float:
        llm.rollback(end - 1)
        started = time.perf_counter()
        llm.forward(history[end - 1:end])
        return time.perf_counter() - started

    def trial(d: Eagle3Drafter, pause: int) -> float:
        d.begin(prompt, rows(0, len(prompt)))
        n = len(prompt) + pause
        started = time.perf_counter()
        d.accept(0, history[len(prompt):n], rows(len(prompt), n))
        d.draft(history[:n + 1], 1)
        return time.perf_counter() - started

    steps: list[float] = []
    seconds: dict[tuple[str, int], list[float]] = {(v, p): [] for v in variants for p in pauses}
    keys = list(seconds)
    for r in range(rounds):
        steps.append(step())
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            seconds[key].append(trial(variants[key[0]], key[1]))
    plain = statistics.median(steps)
    print(f"{llm.name}: decode step {1e3 * plain:.1f} ms (median of {rounds}), {threads} thread(s), prompt "
          f"{len(prompt)} tokens, catch_up {variants['window'].catch_up} rows")
    print("| pause (tokens) | catch-up | ms | decode steps |")
    print("|---:|---|---:|---:|")
    for (variant, pause), times in seconds.items():
        ms = statistics.median(times)
        print(f"| {pause} | {variant} | {1e3 * ms:.1f} | {ms / plain:.2f} |")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    llm.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", required=True, help="the target model")
    p.add_argument("--eagle", required=True, help="the Eagle-3 head's folder")
    p.add_argument("-t", "--threads", type=int, action="append", default=None)
    p.add_argument("--pauses", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("-r", "--rounds", type=int, default=7)
    args = p.parse_args()
    for threads in args.threads or [2]:
        measure(args.model, args.eagle, threads, args.pauses, args.rounds)


if __name__ == "__main__":
    main()
