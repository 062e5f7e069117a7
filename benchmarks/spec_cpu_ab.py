"""The speculative loop and policy before / after a change, by process CPU time, in one process: plain decoding,
each drafter with the working tree's ``loop.py`` + ``policy.py`` and with git revision ``--base``'s (both files
loaded from git, so a change in the loop is compared too; ``benchmarks/spec_policy_ab.py`` swaps ``policy.py``
only), in a rotating order each round, every generation timed by ``time.process_time`` (all threads: robust to a
loaded machine's waiting, not to its shared cores) and by the wall clock.

    PYTHONPATH=core:plugins/cpu python benchmarks/spec_cpu_ab.py -m qwen2.5-coder-1.5b.gguf --base main \\
        --spec lookahead -t 1 -r 6 --prompts chat code

Each Speculation lives through all rounds of a prompt, as in ``hetero bench`` (its policy carried from one
generation to the next, ``Speculation._policy``). Prints per drafter, side and prompt the median over rounds of
plain's CPU seconds / the drafter's (the speed-up; range in brackets), the same by wall clock, the verify steps
per generation, and whether every output equals plain decoding's. ``--log``: the per-step log
(``hetero.llm.steplog``; ``benchmarks/spec_steps.py --summary`` reads it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

SPECULATIVE = "core/hetero/llm/speculative"


def revision_module(rev: str, name: str, root: Path, folder: Path) -> ModuleType:
    """``SPECULATIVE/name.py`` of revision ``rev`` as ``hetero.llm.speculative._base_<name>`` (its relative imports
    resolve to the working tree's package)."""
    text = subprocess.run(["git", "show", f"{rev}:{SPECULATIVE}/{name}.py"], cwd=root, check=True,
                          capture_output=True, text=True).stdout
    path = folder / f"_base_{name}.py"
    path.write_text(text)
    full = f"hetero.llm.speculative._base_{name}"
    spec = importlib.util.spec_from_file_location(full, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", type=Path, required=True)
    p.add_argument("--base", default="main", help="git revision whose loop.py and policy.py are the 'before' side")
    p.add_argument("--spec", action="append", required=True)
    p.add_argument("-t", "--threads", type=int, default=1)
    p.add_argument("-n", type=int, default=64)
    p.add_argument("-r", "--rounds", type=int, default=6)
    p.add_argument("--prompts", nargs="*", default=["chat", "code"])
    p.add_argument("--log", type=Path)
    p.add_argument("--warm", action="store_true", help="plan and record every verify width in the warm-up "
                   "(Speculation.warm); without it the first round's drafts pay each width's cold runs")
    args = p.parse_args()
    if args.log:
        os.environ["HETERO_SPEC_LOG"] = str(args.log)
    import hetero.llm
    from hetero.llm import steplog
    from hetero.llm.speculative import Speculation, make_drafter
    from hetero.llm.speculative.bench import CHAT_MESSAGES, CODE2_PROMPT, CODE_PROMPT

    root = Path(__file__).resolve().parents[1]
    folder = Path(tempfile.mkdtemp())
    base_policy = revision_module(args.base, "policy", root, folder)
    base_loop = revision_module(args.base, "loop", root, folder)
    base_loop.DraftPolicy = base_policy.DraftPolicy  # type: ignore[attr-defined]  # why: the base loop's own policy

    class Before(Speculation):
        """The base revision's loop and policy (its functions run with its module's globals)."""
        start = base_loop.Speculation.start
        _tokens = base_loop.Speculation._tokens
        _policy = base_loop.Speculation._policy

    llm = hetero.llm.load(args.model, backends=["cpu"], on_fallback="silent", threads=args.threads, context=2048)
    labels = [f"{name} ({side})" for name in args.spec for side in ("after", args.base)]
    print("| drafter | prompt | threads | CPU speed-up | wall speed-up | verify steps | identical | rounds | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for prompt in args.prompts:
        specs: list[Any] = []
        for name in args.spec:
            specs += [Speculation(make_drafter(name, llm)), Before(make_drafter(name, llm))]

        def run(s: Any, n: int = args.n, prompt: str = prompt) -> tuple[list[int], float, float, int]:
            cpu, wall = time.process_time(), time.perf_counter()
            if prompt == "chat":
                llm.chat(CHAT_MESSAGES, n, temperature=0, spec=s)
            else:
                llm.generate(CODE_PROMPT if prompt == "code" else CODE2_PROMPT, n, temperature=0, spec=s)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            return list(llm.last.tokens), cpu, wall, llm.stats.verify_steps

        if args.warm:
            for s in specs:
                s.warm(llm)
        for s in [None, *specs]:
            run(s, 4)  # warm-up: the prompt's prefill, plans of the plain step
        runs: list[Any] = [None, *specs]
        cpu_ratios: list[list[float]] = [[] for _ in specs]
        wall_ratios: list[list[float]] = [[] for _ in specs]
        verifies: list[list[int]] = [[] for _ in specs]
        identical = [True] * len(specs)
        for r in range(args.rounds):
            order = list(range(len(runs)))
            shift = r % len(runs)
            order = order[shift:] + order[:shift]
            if r % 2:
                order.reverse()
            got: dict[int, tuple[list[int], float, float, int]] = {}
            for i in order:
                steplog.write("run", prompt=prompt, drafter=labels[i - 1] if i else "plain", repetition=r,
                              threads=args.threads)
                got[i] = run(runs[i])
            for i in range(1, len(runs)):
                cpu_ratios[i - 1].append(got[0][1] / got[i][1])
                wall_ratios[i - 1].append(got[0][2] / got[i][2])
                verifies[i - 1].append(got[i][3])
                identical[i - 1] &= got[i][0] == got[0][0]
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        for j, label in enumerate(labels):
            c, w = cpu_ratios[j], wall_ratios[j]
            print(f"| {label} | {prompt} | {args.threads} | {statistics.median(c):.3f} ({min(c):.2f}-{max(c):.2f}) | "
                  f"{statistics.median(w):.3f} ({min(w):.2f}-{max(w):.2f}) | {verifies[j]} | "
                  f"{'yes' if identical[j] else 'NO'} | {args.rounds} (first {c[0]:.2f}) | {load} |", flush=True)


if __name__ == "__main__":
    main()
