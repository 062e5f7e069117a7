"""A draft-length policy before / after a change, in one process: plain decoding, then each drafter with the policy
of git revision ``--base`` (its ``policy.py``, loaded from git) and with the working tree's, in the rotating order of
``hetero bench --spec`` (so both see the same machine; the table's speed-ups are against the same plain runs).

    PYTHONPATH=core:plugins/cpu python benchmarks/spec_policy_ab.py -m qwen2.5-coder-1.5b.gguf --base main \\
        --spec lookahead --spec draft:sns-0.5b.gguf -t 2 -r 5 [--log steps.jsonl]

The base side starts each generation as the loop does since 2026-12-04 (first draft at one token; graded drafts
with the last generation's plain cost, ``carry_plain``, the others with its step costs, ``carry_costs``), with the
base revision's policy class (which knows nothing of ``Drafter.one_pass``). ``--log``: the per-step log
(``benchmarks/spec_steps.py --summary`` reads it).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from spec_cpu_ab import revision_module  # a git revision's speculative module


def base_policy(rev: str) -> Any:
    """The ``policy`` module of revision ``rev``, imported under another name (spec_cpu_ab's loader)."""
    return revision_module(rev, "policy", Path(__file__).resolve().parents[1], Path(tempfile.mkdtemp()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", type=Path, required=True)
    p.add_argument("--base", default="main", help="git revision whose policy.py is the 'before' side")
    p.add_argument("--spec", action="append", required=True)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-n", type=int, default=64)
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("--prompts", nargs="*", default=["code", "chat"])
    p.add_argument("--log", type=Path)
    args = p.parse_args()
    if args.log:
        os.environ["HETERO_SPEC_LOG"] = str(args.log)
    import hetero.llm
    from hetero.llm import steplog
    from hetero.llm.speculative import Speculation, make_drafter
    from hetero.llm.speculative import bench as spec_bench

    base = base_policy(args.base)

    class Labelled(Speculation):
        def __init__(self, drafter: Any, label: str) -> None:
            self.label = label
            super().__init__(drafter)

        def __repr__(self) -> str:
            return self.label

    class Before(Labelled):
        def _policy(self, previous: Any = None) -> Any:
            graded = bool(getattr(self.drafter, "graded", False))
            policy = base.DraftPolicy(self.max_draft, adaptive=True, start=1, graded=graded)
            if previous is not None and graded:
                policy.carry_plain(previous)
            elif previous is not None:
                policy.carry_costs(previous)
            return policy

    write = steplog.write  # the bench logs each run's drafter by name
    spec_bench.steplog.write = lambda kind, **kw: write(  # type: ignore[assignment]  # a lambda over the module function
        kind, **{k: repr(v) if isinstance(v, Speculation) else v for k, v in kw.items()})
    llm = hetero.llm.load(args.model, backends=["cpu"], on_fallback="silent", threads=args.threads, context=2048)
    specs: list[Any] = []
    for name in args.spec:
        specs += [Labelled(make_drafter(name, llm), f"{name} (after)"),
                  Before(make_drafter(name, llm), f"{name} ({args.base})")]
    results = spec_bench.bench_speculative(llm, specs, n_gen=args.n, repetitions=args.repetitions,
                                           threads=args.threads, prompts=tuple(args.prompts))
    print(spec_bench.spec_table(results))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", file=sys.stderr)


if __name__ == "__main__":
    main()
