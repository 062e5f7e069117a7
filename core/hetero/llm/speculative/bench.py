"""``hetero bench --spec DRAFTER``: speculative against plain decoding on the same model, in the same run.

For each prompt (a code completion and a chat turn that quotes code back) the two are run alternately
(plain, speculative, speculative, plain, ...) with greedy sampling, so both produce the same tokens and see the
same machine; the table gives medians of each and the median of the per-pair speed ratios, the acceptance rate,
tokens per verify step, whether the outputs were identical, and the load average (the machine may be shared).
Several drafters (``--spec A --spec B``) join the same repetitions, in a rotating order, each against the plain
run of its repetition: before / after comparisons of a drafter (``lookahead:flat`` against ``lookahead``).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from ...contract.errors import HeteroError
from .. import steplog
from .registry import speculation

CODE_PROMPT = '''import math
from dataclasses import dataclass


@dataclass
class Vector:
    x: float
    y: float

    def __add__(self, other: "Vector") -> "Vector":
        return Vector(self.x + other.x, self.y + other.y)

    def __sub__(self, other: "Vector") -> "Vector":
        return Vector(self.x - other.x, self.y - other.y)

    def __mul__(self, k: float) -> "Vector":
        return Vector(self.x * k, self.y * k)

    def dot(self, other: "Vector") -> float:
        return self.x * other.x + self.y * other.y

    def length(self) -> float:
        return math.sqrt(self.dot(self))


@dataclass
class Vector3:
    x: float
    y: float
    z: float

    def __add__(self, other: "Vector3") -> "Vector3":
'''

# a second code completion, not in the default set: ``prompts=ALL_PROMPTS`` (benchmarks/speculative.py --live)
CODE2_PROMPT = '''import unittest

from shapes import Circle, Rectangle, Square


class TestCircle(unittest.TestCase):
    def test_area(self):
        self.assertAlmostEqual(Circle(1.0).area(), 3.141592653589793)

    def test_perimeter(self):
        self.assertAlmostEqual(Circle(1.0).perimeter(), 6.283185307179586)

    def test_negative_radius(self):
        with self.assertRaises(ValueError):
            Circle(-1.0)


class TestRectangle(unittest.TestCase):
'''

CHAT_CODE = '''def parse_config(path):
    with open(path) as f:
        lines = f.read().splitlines()
    config = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=", 1)
        config[key.strip()] = value.strip()
    return config'''

CHAT_MESSAGES = [{"role": "user", "content": "Add type hints and a docstring to this function, and show the whole "
                                             f"function:\n\n```python\n{CHAT_CODE}\n```"}]

PROMPTS = ("code", "chat")
ALL_PROMPTS = (*PROMPTS, "code2")


@dataclass
class SpecResult:
    model: str
    threads: int | None
    drafter: str
    prompt: str
    tokens: int  # generated per run
    plain_tps: float  # median decode tokens/s, plain
    spec_tps: float  # median decode tokens/s, speculative
    speedup: float  # median of spec/plain over the pairs
    acceptance: float  # accepted / drafted, over the speculative runs
    tokens_per_verify: float  # committed tokens per verify step that carried a draft
    identical: bool  # every speculative output equal to the plain one
    pairs: int
    load: str  # load average at the end (1, 5, 15 min)
    ratios: list[float] = field(default_factory=list)  # spec/plain of each pair, in run order (the spread)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bench_speculative(llm: Any, drafter: str | list[str], *, n_gen: int = 64, repetitions: int = 3,
                      threads: int | None = None, max_draft: int | None = None,
                      prompts: tuple[str, ...] = PROMPTS) -> list[SpecResult]:
    """One ``SpecResult`` per prompt and drafter. Several drafters (a list) run in the same repetitions as plain
    decoding, the order rotating each time, so their speed-ups compare like for like (before / after a change)."""
    if llm.tokenizer is None:
        raise HeteroError("bench --spec needs a model with a tokenizer (give -m MODEL: the prompts are text)")
    names = [drafter] if isinstance(drafter, str) else list(drafter)
    specs = [speculation(name, llm, max_draft=max_draft) for name in names]
    results = []
    for name in prompts:
        if name not in ALL_PROMPTS:
            raise HeteroError(f"bench --spec: unknown prompt {name!r}; expected one of {ALL_PROMPTS}")
        if name == "chat" and llm.template is None:
            continue  # a model without a chat template: the code prompt only

        def run(s: Any, n: int = n_gen, name: str = name) -> tuple[list[int], Any]:
            if name != "chat":
                llm.generate(CODE_PROMPT if name == "code" else CODE2_PROMPT, n, temperature=0, spec=s)
            else:
                llm.chat(CHAT_MESSAGES, n, temperature=0, spec=s)
            return list(llm.last.tokens), llm.stats

        steplog.write("run", prompt=name, drafter="warm-up", repetition=-1, threads=threads)
        run(None, 4)  # warm-up: the prompt's prefill (cached from here on), plans of both step shapes
        for s in specs:
            s.warm(llm)  # every verify width planned and recorded here, not in the first timed replies
            run(s, 4)
        runs: list[Any] = [None, *specs]  # None: plain decoding
        speed: list[list[float]] = [[] for _ in runs]
        ratios: list[list[float]] = [[] for _ in specs]
        counts = [[0, 0, 0] for _ in specs]  # drafted, accepted, verify steps
        identical = [True] * len(specs)
        for r in range(repetitions):
            order = list(range(len(runs)))
            shift = r % len(runs)
            order = order[shift:] + order[:shift]
            if r % 2:
                order.reverse()
            got: dict[int, tuple[list[int], float]] = {}
            for i in order:
                steplog.write("run", prompt=name, drafter=names[i - 1] if i else "plain", repetition=r,
                              threads=threads)
                tokens, stats = run(runs[i])
                got[i] = (tokens, stats.decode_tokens_per_second)
                if i:
                    counts[i - 1][0] += stats.drafted_tokens
                    counts[i - 1][1] += stats.accepted_tokens
                    counts[i - 1][2] += stats.verify_steps
            for i in range(len(runs)):
                speed[i].append(got[i][1])
            for i in range(1, len(runs)):
                ratios[i - 1].append(got[i][1] / got[0][1] if got[0][1] else 0.0)
                identical[i - 1] &= got[i][0] == got[0][0]
        load = _load()
        for j, drafter_name in enumerate(names):
            drafted, accepted, verify_steps = counts[j]
            results.append(SpecResult(
                model=llm.name, threads=threads, drafter=drafter_name, prompt=name, tokens=n_gen,
                plain_tps=statistics.median(speed[0]), spec_tps=statistics.median(speed[j + 1]),
                speedup=statistics.median(ratios[j]), acceptance=accepted / drafted if drafted else 0.0,
                tokens_per_verify=(accepted + verify_steps) / verify_steps if verify_steps else 0.0,
                identical=identical[j], pairs=repetitions, load=load, ratios=ratios[j]))
    return results


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def spec_table(results: list[SpecResult]) -> str:
    head = ("| model | threads | drafter | prompt | tokens | plain t/s | spec t/s | speed-up | pairs' range | "
            "acceptance | tokens/verify | identical | pairs | load avg |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in results:
        lines.append(f"| {r.model} | {r.threads or 'all'} | {r.drafter} | {r.prompt} | {r.tokens} | "
                     f"{r.plain_tps:.2f} | {r.spec_tps:.2f} | {r.speedup:.2f}x | {_spread(r.ratios)} | "
                     f"{r.acceptance:.0%} | "
                     f"{r.tokens_per_verify:.2f} | {'yes' if r.identical else 'NO'} | {r.pairs} | {r.load} |")
    return "\n".join(lines)


def _spread(ratios: list[float]) -> str:
    """The lowest and highest pair's speed-up: how far one pair of a busy machine swings."""
    return f"{min(ratios):.2f}-{max(ratios):.2f}x" if ratios else "-"
