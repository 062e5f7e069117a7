"""``hetero bench --spec DRAFTER``: speculative against plain decoding on the same model, in the same run.

For each prompt (a code completion and a chat turn that quotes code back) the two are run alternately
(plain, speculative, speculative, plain, ...) with greedy sampling, so both produce the same tokens and see the
same machine; the table gives medians of each and the median of the per-pair speed ratios, the acceptance rate,
tokens per verify step, whether the outputs were identical, and the load average (the machine may be shared).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from ...contract.errors import HeteroError
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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bench_speculative(llm: Any, drafter: str, *, n_gen: int = 64, repetitions: int = 3, threads: int | None = None,
                      max_draft: int | None = None, prompts: tuple[str, ...] = PROMPTS) -> list[SpecResult]:
    if llm.tokenizer is None:
        raise HeteroError("bench --spec needs a model with a tokenizer (give -m MODEL: the prompts are text)")
    spec = speculation(drafter, llm, max_draft=max_draft)
    results = []
    for name in prompts:
        if name not in PROMPTS:
            raise HeteroError(f"bench --spec: unknown prompt {name!r}; expected one of {PROMPTS}")
        if name == "chat" and llm.template is None:
            continue  # a model without a chat template: the code prompt only

        def run(with_spec: bool, n: int = n_gen, name: str = name) -> tuple[list[int], Any]:
            s = spec if with_spec else None
            if name == "code":
                llm.generate(CODE_PROMPT, n, temperature=0, spec=s)
            else:
                llm.chat(CHAT_MESSAGES, n, temperature=0, spec=s)
            return list(llm.last.tokens), llm.stats

        run(False, 4)  # warm-up: the prompt's prefill (cached from here on), plans of both step shapes
        run(True, 4)
        plain: list[float] = []
        fast: list[float] = []
        ratios: list[float] = []
        drafted = accepted = verify_steps = 0
        identical = True
        for r in range(repetitions):
            got: dict[bool, tuple[list[int], float]] = {}
            for with_spec in ((False, True) if r % 2 == 0 else (True, False)):
                tokens, stats = run(with_spec)
                got[with_spec] = (tokens, stats.decode_tokens_per_second)
                if with_spec:
                    drafted += stats.drafted_tokens
                    accepted += stats.accepted_tokens
                    verify_steps += stats.verify_steps
            plain.append(got[False][1])
            fast.append(got[True][1])
            ratios.append(got[True][1] / got[False][1] if got[False][1] else 0.0)
            identical &= got[True][0] == got[False][0]
        results.append(SpecResult(
            model=llm.name, threads=threads, drafter=drafter, prompt=name, tokens=n_gen,
            plain_tps=statistics.median(plain), spec_tps=statistics.median(fast), speedup=statistics.median(ratios),
            acceptance=accepted / drafted if drafted else 0.0,
            tokens_per_verify=(accepted + verify_steps) / verify_steps if verify_steps else 0.0,
            identical=identical, pairs=repetitions, load=_load()))
    return results


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def spec_table(results: list[SpecResult]) -> str:
    head = ("| model | threads | drafter | prompt | tokens | plain t/s | spec t/s | speed-up | acceptance | "
            "tokens/verify | identical | pairs | load avg |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in results:
        lines.append(f"| {r.model} | {r.threads or 'all'} | {r.drafter} | {r.prompt} | {r.tokens} | "
                     f"{r.plain_tps:.2f} | {r.spec_tps:.2f} | {r.speedup:.2f}x | {r.acceptance:.0%} | "
                     f"{r.tokens_per_verify:.2f} | {'yes' if r.identical else 'NO'} | {r.pairs} | {r.load} |")
    return "\n".join(lines)
