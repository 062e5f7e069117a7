"""Plain against speculative decoding by CPU time, for a busy shared machine where wall-clock pairs swing by 10-30%:
the two alternate (greedy, the bench's prompts), and each generation's decode is timed from its first decode step
(after the prompt and a drafter's ``begin``, which count as prefill) to its end, in CPU seconds of the process
(thread CPU time at ``-t 1``, where the process's one thread does everything), with the target's native steps
apart: 1-token steps, wider verify steps, and what runs between them.

    PYTHONPATH=core:plugins/cpu python benchmarks/spec_step_cpu.py -m sns-0.5b.gguf --spec eagle:DIR -t 1 -r 5

``--shadow-ab``: the drafter with every trial verified joins the rotation (plain, verified, shadow trials).

Per generation pair: the speculative run's decode CPU over the plain run's (the median of the pairs is printed;
above 1: speculative decoding costs more CPU per token). At more threads the workers' spinning counts too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def measure(llm: Any, spec: Any, prompt: str, tokens: int, clock: Callable[[], float]) -> dict[str, Any]:
    """One generation: decode CPU seconds, those of the native 1-token and wider steps, the wider steps' count,
    and the drafter's ``draft`` / ``accept`` calls' CPU seconds within the decode (its ``begin`` is the prompt's)."""
    from hetero.llm.speculative.bench import CHAT_MESSAGES, CODE_PROMPT

    steps: list[tuple[int, float, float]] = []  # tokens run, CPU clock at the start, at the end
    drafting: list[tuple[str, float, float]] = []  # drafter call, CPU clock at the start, at the end
    session = llm.session
    drafter = spec.drafter if spec is not None else None

    def timed_call(name: str) -> Callable[..., Any]:
        method = getattr(type(drafter), name)

        def call(*args: Any) -> Any:
            start = clock()
            out = method(drafter, *args)
            drafting.append((name, start, clock()))
            return out
        return call

    def timed(feeds: dict[str, Any], wanted: Any = None) -> Any:
        start = clock()
        out = type(session).run(session, feeds, wanted)
        steps.append((len(feeds["input_ids"]), start, clock()))
        return out

    session.run = timed  # the speculative run's expose_hidden may rebuild the session: a new one is timed next time
    if drafter is not None:
        drafter.draft, drafter.accept = timed_call("draft"), timed_call("accept")
    try:
        if prompt == "chat":
            llm.chat(CHAT_MESSAGES, tokens, temperature=0, spec=spec)
        else:
            llm.generate(CODE_PROMPT, tokens, temperature=0, spec=spec)
        end = clock()
    finally:
        del session.run
        if drafter is not None:
            del drafter.draft, drafter.accept
    decode = steps[1:]  # [0]: the prompt's (cached: its last token)
    first = decode[0][1] if decode else end
    return {"cpu": end - first,
            "one": sum(b - a for n, a, b in decode if n == 1),
            "wider": sum(b - a for n, a, b in decode if n > 1), "verify": sum(n > 1 for n, _, _ in decode),
            "draft": sum(b - a for name, a, b in drafting if name == "draft" and a >= first),
            "accept": sum(b - a for name, a, b in drafting if name == "accept" and a >= first),
            "drafts": sum(name == "draft" and a >= first for name, a, _ in drafting),
            "tokens": list(llm.last.tokens)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", type=Path, required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("-t", "--threads", type=int, default=1)
    p.add_argument("-n", type=int, default=64)
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("--prompts", nargs="*", default=["code", "chat"])
    p.add_argument("--shadow-ab", action="store_true",
                   help="also the drafter with every trial verified (Speculation(shadow=False)), in the same rotation")
    args = p.parse_args()

    import hetero.llm
    from hetero.llm.speculative import Speculation
    from hetero.llm.speculative.registry import speculation

    llm = hetero.llm.load(args.model, backends=["cpu"], on_fallback="silent", threads=args.threads, context=2048)
    spec = speculation(args.spec, llm)
    sides: dict[str, Any] = {"plain": None, "spec": spec}
    if args.shadow_ab:  # the same drafter object: each generation begins it afresh
        sides = {"plain": None, "verified": Speculation(spec.drafter, max_draft=spec.max_draft, shadow=False),
                 "shadow": spec}
    clock = time.thread_time if args.threads == 1 else time.process_time
    for prompt in args.prompts:
        for s in sides.values():  # warm-up: the prompt's prefill, the exposed layers, the drafter
            measure(llm, s, prompt, 4, clock)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
        names = list(sides)
        for r in range(args.repetitions):
            for name in names[r % len(names):] + names[:r % len(names)]:  # a rotating order
                runs[name].append(measure(llm, sides[name], prompt, args.n, clock))
        plain = runs["plain"]
        for name in names[1:]:
            _report(prompt, args, name, plain, runs[name])
        if args.shadow_ab:
            ratios = [b["cpu"] / a["cpu"] for a, b in zip(runs["verified"], runs["shadow"], strict=True)]
            print(f"{prompt} -t {args.threads}: shadow/verified per repetition {[round(x, 4) for x in ratios]}, "
                  f"median {statistics.median(ratios):.4f}", flush=True)


def _report(prompt: str, args: Any, name: str, plain: list[dict[str, Any]], spec: list[dict[str, Any]]) -> None:
    pairs = list(zip(plain, spec, strict=True))
    ms = [(1e3 * a["cpu"] / args.n, 1e3 * b["cpu"] / args.n) for a, b in pairs]
    between = statistics.median(b["cpu"] - b["one"] - b["wider"] - b["draft"] - b["accept"] for _, b in pairs)
    print(f"{prompt} -t {args.threads} {name}: decode CPU ms/token plain {statistics.median(a for a, _ in ms):.3f}, "
          f"spec {statistics.median(b for _, b in ms):.3f}; spec/plain per pair "
          f"{[round(b / a, 4) for a, b in ms]}, median {statistics.median(b / a for a, b in ms):.4f}; "
          f"between native steps and drafter calls plain "
          f"{statistics.median(a['cpu'] - a['one'] for a, _ in pairs):.3f} s, spec {between:.3f} s; "
          f"native 1-token steps plain {statistics.median(a['one'] for a, _ in pairs):.3f} s, spec "
          f"{statistics.median(b['one'] for _, b in pairs):.3f} s; per pair: wider steps "
          f"{[round(b['wider'], 3) for _, b in pairs]} s, the drafter's draft + accept "
          f"{[round(b['draft'] + b['accept'], 3) for _, b in pairs]} s, drafts {[b['drafts'] for _, b in pairs]}, "
          f"verify steps {[b['verify'] for _, b in pairs]}; identical "
          f"{all(a['tokens'] == b['tokens'] for a, b in pairs)}; "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
