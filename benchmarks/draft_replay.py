"""Draft-model variants judged without the policy's timing: each ``--spec draft:...`` drafts a fixed ``--k`` tokens
a step (``Speculation(adaptive=False)``) on the bench's prompts, 1 thread. Prints per variant and prompt the tokens a
verify step commits and the draft model's calls (and rows) per output token (deterministic: no clock), then, with
``-r`` > 0, whole generations timed by process CPU time (robust to a loaded machine's waiting, not to its shared
cores), plain decoding and every variant in a rotating order each round: the median of the paired ratios to plain
decoding and to the first variant. Every speculative output is checked against plain decoding's.

    PYTHONPATH=core:plugins/cpu python benchmarks/draft_replay.py -m qwen2.5-coder-1.5b.gguf \\
        --spec draft:sns-0.5b.gguf,quant=q4 --spec draft:sns-0.5b.gguf -r 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter
from typing import Any


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", required=True, help="the target model")
    p.add_argument("--spec", action="append", required=True, help="draft:PATH[,options] (several: compared)")
    p.add_argument("--prompts", nargs="+", default=["code", "chat"], help="code, chat, code2")
    p.add_argument("-k", "--k", type=int, default=10, help="tokens drafted a step")
    p.add_argument("-n", type=int, default=64, help="tokens generated")
    p.add_argument("-r", "--rounds", type=int, default=0, help="timed rounds (0: acceptance only)")
    args = p.parse_args()

    import hetero.llm
    from hetero.llm import model as llm_model
    from hetero.llm.speculative import Speculation
    from hetero.llm.speculative.bench import CHAT_MESSAGES, CODE2_PROMPT, CODE_PROMPT
    from hetero.llm.speculative.registry import make_drafter

    calls: Counter[str] = Counter()
    target: Any = None  # (set below; the counting wrappers read it at call time)
    for method in ("forward", "verify"):  # the draft model's calls: an Llm loaded with head_rows or not the target
        original = getattr(llm_model.Llm, method)

        def counted(self: Any, ids: Any, *a: Any, _f: Any = original, _n: str = method, **kw: Any) -> Any:
            if self is not target:
                calls[_n] += 1
                calls["rows"] += len(ids)
            return _f(self, ids, *a, **kw)

        setattr(llm_model.Llm, method, counted)
    target = hetero.llm.load(args.model, backends=["cpu"], on_fallback="silent", threads=1, context=1024,
                             progress=False)
    drafters = {spec: make_drafter(spec, target) for spec in args.spec}

    def run(prompt: str, spec: str | None) -> tuple[float, list[int]]:
        s = None if spec is None else Speculation(drafters[spec], max_draft=args.k, adaptive=False)
        started = time.process_time()
        if prompt == "chat":
            target.chat(CHAT_MESSAGES, args.n, temperature=0, spec=s)
        else:
            target.generate(CODE_PROMPT if prompt == "code" else CODE2_PROMPT, args.n, temperature=0, spec=s)
        return time.process_time() - started, list(target.last.tokens)

    print(f"| draft | prompt | tokens / verify (k={args.k}) | draft calls (rows) / output token |")
    print("|---|---|---:|---:|")
    plain = {prompt: run(prompt, None)[1] for prompt in args.prompts}
    for spec in args.spec:
        for prompt in args.prompts:
            calls.clear()
            _, tokens = run(prompt, spec)
            if tokens != plain[prompt]:
                raise SystemExit(f"{spec} on {prompt}: the output differs from plain decoding's")
            n = len(tokens)
            print(f"| {spec} | {prompt} | {n / max(target.stats.verify_steps, 1):.2f} | "
                  f"{(calls['forward'] + calls['verify']) / n:.2f} ({calls['rows'] / n:.2f}) |")
    if args.rounds <= 0:
        return
    names: list[str | None] = [None, *args.spec]
    print("| draft | prompt | CPU s / generation | speed-up over plain | vs first draft |")
    print("|---|---|---:|---:|---:|")
    for prompt in args.prompts:
        seconds: dict[str | None, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                seconds[name].append(run(prompt, name)[0])
        for name in names:
            to_plain = statistics.median(a / b for a, b in zip(seconds[None], seconds[name], strict=True))
            to_first = statistics.median(a / b for a, b in zip(seconds[name], seconds[args.spec[0]], strict=True))
            print(f"| {name or 'plain'} | {prompt} | {statistics.median(seconds[name]):.2f} | {to_plain:.2f}x | "
                  f"{to_first:.3f} |")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
