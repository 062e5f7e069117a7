"""Where a speculative reply's decode-thread CPU goes, method by method, against plain decoding's (issue 15, chat34b).

Plain and speculative replies alternate (the order swapped every round); every native step (``session.run``) is
timed by the decode thread's CPU clock (``time.thread_time_ns``: robust to a loaded machine's waiting), with its
width and the outputs it asked for, and the loop's bookkeeping (the drafter's ``draft`` / ``accept``, the policy's
methods, ``_keep``) by the same clock. Prints per round: the median one-token native step of each reply, the CPU
outside native steps per reply, the reply's CPU; then the medians of the paired ratios and the last speculative
reply's bookkeeping (ms, calls). The wrappers cost ~1 us a call (charged to the speculative side).
``benchmarks/spec_step_cpu.py`` splits the same CPU into 1-token steps, wider steps and the rest, for any drafter.

    PYTHONPATH=core:plugins/cpu python benchmarks/spec_loop_cpu.py -m /work/models/qwen2.5-coder-1.5b.gguf -r 8
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CLOCK = time.thread_time_ns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", type=Path, required=True)
    p.add_argument("--spec", default="lookahead")
    p.add_argument("-t", "--threads", type=int, default=1)
    p.add_argument("-n", type=int, default=64)
    p.add_argument("-r", "--rounds", type=int, default=8)
    p.add_argument("--prompt", default="chat", choices=["chat", "code"])
    args = p.parse_args()
    import hetero.llm
    from hetero.llm.speculative import Speculation, make_drafter, policy
    from hetero.llm.speculative.bench import CHAT_MESSAGES, CODE_PROMPT

    llm = hetero.llm.load(args.model, backends=["cpu"], on_fallback="silent", threads=args.threads, context=2048)
    spec = Speculation(make_drafter(args.spec, llm))
    spent: dict[str, int] = collections.defaultdict(int)
    counts: dict[str, int] = collections.defaultdict(int)
    steps: list[tuple[int, int, tuple[str, ...]]] = []  # width, thread ns, outputs asked for
    run = llm.session.run

    def timed_run(feeds: dict[str, Any], wanted: list[str]) -> Any:
        started = CLOCK()
        out = run(feeds, wanted)
        steps.append((len(feeds["input_ids"]), CLOCK() - started, tuple(wanted)))
        return out

    llm.session.run = timed_run

    def wrap(owner: Any, name: str, key: str) -> None:
        f: Callable[..., Any] = getattr(owner, name)

        def timed(*a: Any, **k: Any) -> Any:
            started = CLOCK()
            try:
                return f(*a, **k)
            finally:
                spent[key] += CLOCK() - started
                counts[key] += 1

        setattr(owner, name, timed)

    for name in ("quiet_steps", "length", "shadow_trial", "cut", "observe_first", "record", "record_quiet",
                 "record_shadow"):
        wrap(policy.DraftPolicy, name, f"policy.{name}")
    for name in ("draft", "accept"):
        wrap(type(spec.drafter), name, f"drafter.{name}")
    wrap(type(llm), "_keep", "llm._keep")

    def reply(s: Any, n: int = args.n) -> None:
        if args.prompt == "chat":
            llm.chat(CHAT_MESSAGES, n, temperature=0, spec=s)
        else:
            llm.generate(CODE_PROMPT, n, temperature=0, spec=s)

    spec.warm(llm)
    reply(None, 4)
    reply(spec, 4)
    got: dict[str, list[tuple[float, float, float]]] = {"plain": [], args.spec: []}  # 1-token step, outside, reply
    outputs: dict[str, set[tuple[str, ...]]] = {"plain": set(), args.spec: set()}
    for r in range(args.rounds):
        for side in (["plain", args.spec] if r % 2 == 0 else [args.spec, "plain"]):
            if side != "plain":  # the bookkeeping of the last speculative reply
                spent.clear()
                counts.clear()
            mark, started = len(steps), CLOCK()
            reply(None if side == "plain" else spec)
            total = CLOCK() - started
            mine = steps[mark:]
            ones = [ns for width, ns, _ in mine if width == 1]
            outputs[side] |= {wanted for width, _, wanted in mine if width == 1}
            got[side].append((statistics.median(ones) / 1e6, (total - sum(ns for _, ns, _ in mine)) / 1e6,
                              total / 1e6))
        a, b = got["plain"][-1], got[args.spec][-1]
        print(f"round {r}: 1-token step ms plain {a[0]:.2f} {args.spec} {b[0]:.2f} | outside native ms/reply "
              f"{a[1]:.1f} {b[1]:.1f} | reply ms {a[2]:.0f} {b[2]:.0f} | load {os.getloadavg()[0]:.1f}", flush=True)
    pairs = list(zip(got["plain"], got[args.spec], strict=True))
    print(f"median {args.spec}/plain: 1-token step {statistics.median(b[0] / a[0] for a, b in pairs):.3f}, "
          f"outside native {statistics.median(b[1] / a[1] for a, b in pairs):.2f} "
          f"({statistics.median(b[1] - a[1] for a, b in pairs):+.1f} ms/reply), "
          f"reply CPU speed-up {statistics.median(a[2] / b[2] for a, b in pairs):.3f}")
    print("1-token steps' outputs asked:", {side: sorted(o) for side, o in outputs.items()})
    print("last reply's bookkeeping (ms, calls):",
          {key: (round(ns / 1e6, 2), counts[key]) for key, ns in sorted(spent.items())})


if __name__ == "__main__":
    main()
