"""Lookahead drafting strategies replayed offline on a model's own greedy output: which drafts and lengths would pay.

Greedy speculative decoding commits exactly the plain greedy output, so once that output is known (one plain run
per prompt), every drafting strategy can be replayed without the model: a step drafts from the history, keeps the
longest prefix that matches the known continuation, and costs what a verify step of that many tokens costs
(``--cost``: a step of T = 1, 2, ... tokens relative to a decode step, measured on the real model: docs/speculative.md).
Speed-up = tokens / total cost. No Python overhead and no cold (planning) steps, so the real loop does a little
worse; the ranking of strategies is what this is for.

Strategies: ``flat`` (the drafter before confidence classes: n-grams of 2-4, one acceptance rate, the policy's
length), ``graded`` (hetero's Lookahead and DraftPolicy as the loop drives them), ``chain K`` (fixed length K),
``oracle`` (the latest longest match, cut to exactly its accepted length: what a perfect length choice would get)
and ``tree W x K`` (the W most recent distinct continuations of the longest matches, K deep, merged into a token
tree and verified in one pass: it commits the longest branch that matches, at the cost of all the tree's nodes).

``--stdlib`` adds prompts cut from the Python standard library on this machine (the 60 lines before a point a
quarter to half-way into a file, to complete; or 25 lines in a chat turn asking for type hints), so that a
strategy is not tuned to the two bench prompts; the last columns are geometric means over the code and the chat
prompts.

``--truths FILE`` keeps the greedy outputs in a JSON file (computed once, then read back: a policy change replays in
seconds).

    PYTHONPATH=core:plugins/cpu python benchmarks/lookahead_replay.py -m qwen2.5-coder-1.5b.gguf [-n 64 128] \
        [--stdlib] [--truths /tmp/truths.json] [--cost 1 1.1 ...]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

from hetero.llm.speculative import Lookahead, Speculation
from hetero.llm.speculative.bench import CHAT_MESSAGES, CODE2_PROMPT, CODE_PROMPT
from hetero.llm.speculative.drafter import as_draft
from hetero.llm.speculative.policy import COLD_RUNS

STDLIB_CODE = ("json/encoder.py", "csv.py", "fractions.py", "dataclasses.py", "statistics.py")
STDLIB_CHAT = ("shlex.py", "textwrap.py", "heapq.py")
# T = 1..9, Qwen2.5-Coder-1.5B q4_k_m, 1 thread, Intel AVX-512 VNNI / AMX (2026-12-03: benchmarks/speculative.py
# --gguf); on the earlier AMD Zen-4 machine it was 1 / 1.09 / 1.48 / 1.78 / 2.05 / 2.31 / 2.44 / 2.57 (T = 1..8)
COST = (1.0, 1.07, 1.37, 1.40, 1.58, 1.65, 1.77, 1.83, 1.88)
Strategy = Callable[[list[int]], list[list[int]]]  # history -> candidate continuations (a chain or a tree)


def step_cost(tokens: int, table: Sequence[float]) -> float:
    if tokens <= len(table):
        return table[tokens - 1]
    return table[-1] + (table[-1] - table[-2]) * (tokens - len(table))


def matches(history: list[int], min_len: int = 1, cap: int = 32) -> list[tuple[int, int]]:
    """(match length, continuation start) of every earlier occurrence of the history's last token(s), longest
    first, then most recent."""
    end, found = len(history), []
    for s in range(end - 1):
        if history[s] != history[-1]:
            continue
        n = 1
        while n < cap and s - n >= 0 and history[s - n] == history[end - 1 - n]:
            n += 1
        if n >= min_len:
            found.append((n, s + 1))
    return sorted(found, key=lambda m: (-m[0], -m[1]))


def tree(width: int, depth: int) -> Strategy:
    def candidates(history: list[int]) -> list[list[int]]:
        out: list[list[int]] = []
        for _, start in matches(history, 2):
            branch = history[start:start + depth]
            if branch and branch not in out:
                out.append(branch)
            if len(out) == width:
                break
        return out
    return candidates


def replay(prompt: list[int], truth: list[int], strategy: Strategy, table: Sequence[float]) -> float:
    done, cost = 0, 0.0
    while done < len(truth):
        branches = strategy(prompt + truth[:done])
        nodes = {tuple(b[:i]) for b in branches for i in range(1, len(b) + 1)}
        kept = max((_prefix(b, truth[done:]) for b in branches), default=0)
        cost += step_cost(1 + len(nodes), table)
        done += kept + 1
    return len(truth) / cost


def replay_policy(prompt: list[int], truth: list[int], drafter: Lookahead, table: Sequence[float],
                  replies: int = 1, noise: float = 0.0, seed: int = 0) -> float:
    """The loop's own drafter and policy, with step costs from ``table`` instead of the clock. ``replies``: the
    same prompt answered that many times by one ``Speculation`` (its policy carried from reply to reply, as in
    ``hetero bench``'s repetitions); the speed-up of the last. ``noise``: the policy is told each step's cost times
    exp(N(0, noise)) (a shared machine's timings; the speed-up is still priced at the table's costs), from a
    generator seeded with ``seed``."""
    spec = Speculation(drafter)
    rng = random.Random(seed)

    def timed(cost: float) -> float:
        return cost * math.exp(rng.gauss(0.0, noise)) if noise > 0 else cost

    speed = 0.0
    for _ in range(replies):
        policy = spec.policy = spec._policy(spec.policy if _ else None)
        if not _:
            for _warm in range(COLD_RUNS + 1):
                policy.record(0, 0, 1, timed(table[0]), 0)  # the loop starts with warm plain steps
        drafter.reset()
        done, cost = 0, 0.0
        while done < len(truth):
            k = policy.length(done)
            draft = as_draft(drafter.draft(prompt + truth[:done], k), k, 1 << 30) if k else as_draft([], 0, 1)
            first = draft.tokens[0] if draft.tokens else None
            if draft.confidence is not None:
                draft = as_draft(draft, policy.cut(draft.confidence), 1 << 30)
                if first is not None and not draft.tokens:  # cut to a plain step: scored by it, as in the loop
                    policy.observe_first(draft.confidence, first == truth[done])
            kept = _prefix(draft.tokens, truth[done:])
            seconds = step_cost(len(draft.tokens) + 1, table)
            policy.record(len(draft.tokens), kept, kept + 1, timed(seconds), done, draft.confidence)
            cost += seconds
            done += kept + 1
        speed = len(truth) / cost
    return speed


def oracle(prompt: list[int], truth: list[int], table: Sequence[float]) -> float:
    done, cost = 0, 0.0
    while done < len(truth):
        found = matches(prompt + truth[:done], 2)
        history = prompt + truth[:done]
        kept = _prefix(history[found[0][1]:found[0][1] + 8], truth[done:]) if found else 0
        cost += step_cost(kept + 1, table)
        done += kept + 1
    return len(truth) / cost


def _replayer(strategy: Strategy, table: Sequence[float]) -> Callable[[list[int], list[int]], float]:
    return lambda prompt, truth: replay(prompt, truth, strategy, table)


def _prefix(branch: Sequence[int], truth: Sequence[int]) -> int:
    n = 0
    while n < len(branch) and n < len(truth) and branch[n] == truth[n]:
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("-n", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--stdlib", action="store_true", help="add prompts cut from the Python standard library")
    parser.add_argument("--cost", type=float, nargs="+", default=list(COST), help="step cost for T = 1, 2, ...")
    parser.add_argument("--replies", type=int, default=1, help="answers of each prompt with the policy carried "
                        "from one to the next (hetero bench's repetitions): the last one's speed-up")
    parser.add_argument("--truths", type=Path, help="JSON file of the greedy outputs: read if it has them all, "
                        "else computed and written")
    parser.add_argument("--noise", type=float, default=0.0, help="the policies are told each step's cost times "
                        "exp(N(0, NOISE)) (a busy machine's timings); their speed-ups are geometric means over --seeds")
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    runs = _truths(args.model, _prompts(args.stdlib), max(args.n), args.truths)
    seeds = range(args.seeds if args.noise > 0 else 1)

    def policy(drafter: Callable[[], Lookahead]) -> Callable[[list[int], list[int]], float]:
        return lambda p, t: math.exp(sum(math.log(replay_policy(p, t, drafter(), args.cost, args.replies, args.noise,
                                                                seed)) for seed in seeds) / len(seeds))

    strategies: dict[str, Callable[[list[int], list[int]], float]] = {
        "flat": policy(lambda: Lookahead(min_ngram=2, graded=False)),
        "graded": policy(Lookahead),
        "oracle": lambda p, t: oracle(p, t, args.cost),
    }
    for w, k in ((1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (4, 2), (4, 4)):
        strategies[f"chain {k}" if w == 1 else f"tree {w}x{k}"] = _replayer(tree(w, k), args.cost)
    print("| strategy | " + " | ".join(f"{name} {n}" for name in runs for n in args.n) + " | code | chat |")
    print("|---|" + "---:|" * (len(runs) * len(args.n) + 2))
    for label, fn in strategies.items():
        speed = {(name, n): fn(p, t[:n]) for name, (p, t) in runs.items() for n in args.n}
        cells = [f"{x:.2f}x" for x in speed.values()]
        for kind in ("code", "chat"):
            picked = [math.log(x) for (name, _), x in speed.items() if name.startswith(kind)]
            cells.append(f"{math.exp(sum(picked) / len(picked)):.2f}x")
        print(f"| {label} | " + " | ".join(cells) + " |")


def _truths(model: str, prompts: list[tuple[str, bool, str]], n: int,
            cache: Path | None) -> dict[str, tuple[list[int], list[int]]]:
    """name -> (prompt tokens, the model's first ``n`` greedy tokens), from ``cache`` when it has them all."""
    if cache is not None and cache.exists():
        saved = json.loads(cache.read_text())  # {"n": tokens asked for, "runs": {name: [prompt, output]}}
        known = {name: (p, t) for name, (p, t) in saved["runs"].items()}
        if saved["n"] >= n and all(name in known for name, _, _ in prompts):
            return {name: known[name] for name, _, _ in prompts}
    import hetero.llm

    llm = hetero.llm.load(model, on_fallback="silent", context=4096)
    runs = {}
    for name, chat, text in prompts:
        if chat:
            llm.chat([{"role": "user", "content": text}], n, temperature=0)
        else:
            llm.generate(text, n, temperature=0)
        runs[name] = (list(llm.tokens[:llm.stats.prompt_tokens]), list(llm.last.tokens))
    if cache is not None:
        cache.write_text(json.dumps({"n": n, "runs": runs}))
    return runs


def _prompts(stdlib: bool) -> list[tuple[str, bool, str]]:
    """(name, is a chat turn, text): the bench's two prompts, and with ``stdlib`` those cut from the library."""
    prompts = [("code", False, CODE_PROMPT), ("chat", True, CHAT_MESSAGES[0]["content"]),
               ("code code2", False, CODE2_PROMPT)]
    if not stdlib:
        return prompts
    lib, rng = Path(sysconfig.get_paths()["stdlib"]), random.Random(1)
    for file in (*STDLIB_CODE, *STDLIB_CHAT):
        lines = (lib / file).read_text().splitlines(keepends=True)
        at = rng.randrange(len(lines) // 4, len(lines) // 2)
        chat = file in STDLIB_CHAT
        text = ("Add type hints to this code and show all of it:\n\n```python\n" + "".join(lines[at:at + 25]) + "```"
                if chat else "".join(lines[at - 60:at]))
        prompts.append((f"{'chat' if chat else 'code'} {Path(file).stem}", chat, text))
    return prompts


if __name__ == "__main__":
    main()
