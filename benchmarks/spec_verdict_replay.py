"""Sizes a cross-reply verdict on a speculative step log (``HETERO_SPEC_LOG``, ``hetero bench --spec-log``,
``benchmarks/spec_cpu_ab.py --log``): per drafter and prompt, each reply's ledger (the plain steps its verify steps
gained: tokens committed - the step's seconds / the policy's plain cost at that step, leaving out the first
``--cold`` steps of each verify width in the process), and what benching the whole reply after each one whose
ledger ended below ``-margin`` would have saved (an upper bound: no resumption, the benched reply's verify gain
removed; negative: it would have cost).

    python benchmarks/spec_verdict_replay.py /tmp/spec.jsonl --margin 1
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import defaultdict


def ledgers(path: str, cold: int) -> dict[tuple[str, str], list[float]]:
    """(drafter, prompt) -> each reply's ledger, in the log's order."""
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    seen: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)
    key: tuple[str, str] | None = None
    with open(path) as log:
        for line in log:
            step = json.loads(line)
            if step["kind"] == "run":
                key = (step["drafter"], step["prompt"])
                if step["drafter"] in ("plain", "warm-up"):
                    key = None
                else:
                    out[key].append(0.0)
            elif step["kind"] == "spec" and key is not None and step["drafted"] > 0 and not step.get("shadow"):
                size = step["drafted"] + 1
                runs = seen[key][size] = seen[key].get(size, 0) + 1
                if runs > cold and step["plain_cost"]:
                    out[key][-1] += step["committed"] - step["seconds"] / step["plain_cost"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+")
    parser.add_argument("--margin", type=float, default=1.0, help="plain steps a reply must lose to bench the next")
    parser.add_argument("--cold", type=int, default=2, help="steps of each width in the process left out")
    args = parser.parse_args()
    print("| log | drafter | prompt | replies | ledgers (plain steps) | benched | saved (plain steps) |")
    print("|---|---|---|---|---|---|---|")
    for path in args.logs:
        for (drafter, prompt), ends in ledgers(path, args.cold).items():
            benched = [e for before, e in itertools.pairwise(ends) if before < -args.margin]
            print(f"| {path} | {drafter} | {prompt} | {len(ends)} | {', '.join(f'{e:+.1f}' for e in ends)} | "
                  f"{len(benched)} | {-sum(benched):+.1f} |")


if __name__ == "__main__":
    main()
