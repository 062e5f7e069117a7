"""A draft-length policy before / after a change, replayed without a machine: ``DraftPolicy`` of git revision
``--base`` and of the working tree drive the same simulated drafter and target, generation after generation, and
the table gives the speed against plain decoding (1 s a step) of the first generation and of the later ones.

    PYTHONPATH=core python benchmarks/spec_policy_replay.py --base main [--generations 10] [--seeds 20]

Deterministic (seeded), so a change of a few tenths of a per cent shows, where ``hetero bench`` pairs on the shared
machine swing by 10-30%. The simulated costs follow the step logs of the 0.5B / 1.5B targets on this CPU: a verify
pass of T tokens costs 1 + slope (T - 1) plain steps, 2.5x that the first time a width runs (the executor plans it)
and 2x the second (records it); the drafter's first call costs 1.8x, its second 1.3x (its own shapes). Widths stay
cold or warm across generations (one process), and plain decoding's width was warmed by the bench's warm-up.
Each draft token is right with probability ``p`` until the first wrong one. A policy with shadow trials
(``DraftPolicy.shadow_trial``) has them replayed as the loop runs them: the drafting, then plain steps up to the
first wrong draft token. A generation of 64 tokens starts with the
token of the prompt's logits, as the loop does; the first (``4`` tokens) is the bench's warm-up, not counted.
"""

from __future__ import annotations

import argparse
import inspect
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec_policy_ab import base_policy  # the policy module of a git revision

COLD = (2.5, 2.0)  # a verify width's first and second runs, x its warm cost
DRAFT_COLD = (1.8, 1.3)  # the drafter's first and second calls


@dataclass
class Drafter:
    name: str
    p: float  # chance that each draft token is right (until the first wrong one)
    draft: float  # plain steps a pass (one_pass) or a draft token costs
    one_pass: bool
    slope: float  # extra plain steps per extra verified token
    max_draft: int


DRAFTERS = [
    Drafter("useless block drafter (random DFlash)", 0.0, 0.35, True, 0.2, 4),
    Drafter("weak block drafter (DFlash trained here, 25%)", 0.25, 0.35, True, 0.2, 4),
    Drafter("block drafter at 60%", 0.6, 0.35, True, 0.2, 4),
    Drafter("draft model, code (100%)", 1.0, 0.22, False, 0.09, 10),
    Drafter("draft model, chat (80%)", 0.8, 0.22, False, 0.09, 10),
    Drafter("draft model, prose (30%)", 0.3, 0.22, False, 0.09, 10),
]


def new_policy(module: Any, d: Drafter, previous: Any) -> Any:
    kwargs = {"one_pass": d.one_pass} if "one_pass" in inspect.signature(module.DraftPolicy).parameters else {}
    policy = module.DraftPolicy(d.max_draft, start=1, **kwargs)
    if previous is not None:
        policy.carry_costs(previous)
    return policy


def replay(module: Any, d: Drafter, generations: int, seed: int) -> list[float]:
    """Speed against plain decoding of each counted generation."""
    rng = random.Random(seed)
    width_runs: dict[int, int] = {}
    draft_calls = 0
    previous, out = None, []
    for g in range(generations + 1):
        tokens = 4 if g == 0 else 64
        policy = new_policy(module, d, previous)
        produced, seconds = 1, 0.0
        if g == 0:  # the warm-up: plain decoding's width is warm already (the plain warm-up ran before)
            width_runs[1] = max(width_runs.get(1, 0), 3)
        while produced < tokens:
            # a pause's plain steps recorded at once, as the loop does (revisions before it record each)
            quiet = min(policy.quiet_steps(produced), tokens - produced) if hasattr(policy, "quiet_steps") else 0
            if quiet:
                width_runs[1] += quiet
                policy.record_quiet(produced, quiet, float(quiet))
                produced += quiet
                seconds += quiet
                continue
            k = policy.length(produced)
            shadow = bool(k) and hasattr(policy, "shadow_trial") and policy.shadow_trial(produced)
            draft = 0.0
            kept = 0
            if k:
                draft = d.draft * (1 if d.one_pass else k)
                draft *= DRAFT_COLD[draft_calls] if draft_calls < len(DRAFT_COLD) else 1.0
                draft_calls += 1
                while kept < k and rng.random() < d.p:
                    kept += 1
            if shadow:  # scored against plain steps: up to the first wrong draft token, or the one after the draft
                steps = min(kept + 1, tokens - produced)
                width_runs[1] += steps
                policy.record_quiet(produced, steps, float(steps))
                produced += steps
                seconds += draft + steps
                if steps == kept + 1:  # (a generation that ends amid the trial records its steps only)
                    policy.record_shadow(k, kept, produced, draft)
                continue
            runs = width_runs[k + 1] = width_runs.get(k + 1, 0) + 1
            verify = (1 + d.slope * k) * (COLD[runs - 1] if runs <= len(COLD) else 1.0)
            policy.record(k, kept, kept + 1, draft + verify, produced, draft_seconds=draft)
            produced += kept + 1
            seconds += draft + verify
        if g:
            out.append((produced - 1) / seconds)  # tokens after the first (the prompt's) per plain-step second
        previous = policy
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="main")
    p.add_argument("--generations", type=int, default=10)
    p.add_argument("--seeds", type=int, default=20)
    args = p.parse_args()
    from hetero.llm.speculative import policy as now

    sides = {args.base: base_policy(args.base), "now": now}
    print("| drafter | policy | gen 1 (median of seeds) | gen 1 (worst) | later gens (mean) | later (worst) |")
    print("|---|---|---:|---:|---:|---:|")
    for d in DRAFTERS:
        for label, module in sides.items():
            runs = [replay(module, d, args.generations, seed) for seed in range(args.seeds)]
            first = [r[0] for r in runs]
            later = [x for r in runs for x in r[1:]]
            print(f"| {d.name} | {label} | {statistics.median(first):.3f}x | {min(first):.3f}x | "
                  f"{statistics.mean(later):.3f}x | {min(later):.3f}x |")


if __name__ == "__main__":
    main()
