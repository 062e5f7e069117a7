"""A/B of the Python around an LLM decode step (the generation loop, the sampler, the detokenizer, the stop checks,
``Llm._advance`` / ``forward``): two checkouts of hetero in paired, alternating subprocess rounds.

    python benchmarks/decode_python_ab.py [MODEL.gguf] [--base /work/base33] [--rounds 2] [--threads 1] \
        [--only greedy]

Per sampling setting (greedy; greedy with two stop strings; llama.cpp's defaults, seeded; temperature 0.7 + top-p
0.9, seeded) a subprocess generates 16 and 64 tokens after a short prompt (no EOS stops them early on this prompt;
checked) and times the thread CPU outside ``Session.run`` (which is wrapped with a timer): per step
(outside(64) - outside(16)) / 48, so the per-call setup (tokenizing, prefill) cancels, and that as a share of the
step's thread CPU, and the whole step's thread CPU (inside + outside: a change that moves work from Python into
the step's native calls shows there). It also prints whether both checkouts generated the same tokens (greedy and
seeded runs must be bit-identical). Each round runs base, new, new, base (``--base``: its ``core`` and
``plugins/cpu`` first on PYTHONPATH; this checkout's otherwise); printed are medians over runs, and the median of the
paired new / base ratios. On a shared machine, quote the ratios.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SETTINGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0},
    "greedy + 2 stops": {"temperature": 0, "stop": ["\n\n\n\n", "```"]},
    "llama.cpp defaults": {"seed": 7},
    "t0.7 top-p 0.9": {"seed": 3, "temperature": 0.7, "top_k": 0, "top_p": 0.9, "min_p": 0},
}
PROMPT = "def quicksort(arr):"


def _child(model: str, threads: int, only: list[str]) -> None:
    import hetero.llm as hl

    llm = hl.load(model, context=512, threads=threads)
    inside = [0]
    run = llm.session.run

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time_ns()
        try:
            return run(*args, **kwargs)
        finally:
            inside[0] += time.thread_time_ns() - started

    llm.session.run = timed  # type: ignore[method-assign]  # why: a timer around the instance's run, this process only

    def outside(n: int, options: dict[str, Any]) -> tuple[int, int, list[int]]:
        llm.reset()
        inside[0] = 0
        started = time.thread_time_ns()
        llm.generate(PROMPT, n, **options)
        total = time.thread_time_ns() - started
        if llm.stats.generated_tokens != n:
            raise SystemExit(f"generation stopped after {llm.stats.generated_tokens} of {n} tokens")
        return total - inside[0], inside[0], list(llm.last.tokens)

    result = {}
    for name, options in SETTINGS.items():
        if only and name not in only:
            continue
        llm.generate(PROMPT, 2, **options)  # warm-up: the prompt's and the step's shapes planned and recorded
        per, share, step = [], [], []
        tokens: list[int] = []
        for _ in range(3):
            short, short_in, _ = outside(16, options)
            long, long_in, tokens = outside(64, options)
            python = (long - short) / 48
            per.append(python / 1e3)
            share.append(100 * python / (python + (long_in - short_in) / 48))
            step.append((python + (long_in - short_in) / 48) / 1e3)
        result[name] = {"us": statistics.median(per), "share": statistics.median(share), "tokens": tokens,
                        "step": statistics.median(step)}
    print(json.dumps(result))


def _run(checkout: Path, model: str, threads: int, only: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(checkout / "core"), str(checkout / "plugins" / "cpu"),
                                                       os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, __file__, "--child", model, "--threads", str(threads),
                          *(f"--only={name}" for name in only)], env=env,
                         capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="/work/models/sns-0.5b.gguf")
    ap.add_argument("--base", type=Path, help="the checkout to compare against (default: none, new only)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", action="append", default=[], choices=list(SETTINGS),
                    help="run only this setting (repeatable)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.model, args.threads, args.only)
        return 0
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    order = ["base", "new", "new", "base"] if args.base else ["new"]
    for _ in range(args.rounds):
        for side in order:
            checkout = args.base if side == "base" else ROOT
            runs[side].append(_run(checkout, args.model, args.threads, args.only))
    for name in SETTINGS:
        if args.only and name not in args.only:
            continue
        new = runs["new"]
        line = (f"{name:20s} new {statistics.median(r[name]['us'] for r in new):8.1f} us/step "
                f"({statistics.median(r[name]['share'] for r in new):5.2f} % of the step)")
        if args.base:
            base = runs["base"]
            ratios = [n[name]["us"] / b[name]["us"] for n, b in zip(new, base, strict=True)]
            same = all(n[name]["tokens"] == b[name]["tokens"] for n in new for b in base)
            steps = [n[name]["step"] / b[name]["step"] for n, b in zip(new, base, strict=True)]
            step_new = statistics.median(r[name]["step"] for r in new)
            step_base = statistics.median(r[name]["step"] for r in base)
            line += (f"  base {statistics.median(r[name]['us'] for r in base):8.1f} us/step "
                     f"({statistics.median(r[name]['share'] for r in base):5.2f} %)  new/base "
                     f"{statistics.median(ratios):.3f}  whole step new {step_new:.0f} / base {step_base:.0f} us "
                     f"(new/base {statistics.median(steps):.3f})  tokens identical: {same}")
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
