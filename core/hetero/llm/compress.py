"""Token compression: fit a plain-text input into a token budget by keeping its most relevant sentences.

The scoring, chosen to be cheap (no model pass) and predictable:

1. The text is cut into units: sentences (ending in ``.``, ``!`` or ``?`` before whitespace) and lines. Each unit
   keeps its trailing whitespace, so the kept units, concatenated in their original order, read as the text did.
2. Each unit is scored by BM25 (k1 = 1.2, b = 0.75) against the query's words, the units being the documents: a unit
   that shares the query's rarer words scores highest. The query is the question when the caller has one; else it is
   the text's first two units and last two (where a plain prompt puts its instruction, before the material or
   after it: a question and its answer format are often two sentences), which are then always kept; a unit's score
   is then its best match with one of them, each divided by that unit's match with itself (so that a long sentence
   among them does not outweigh a short question).
3. Units are taken by score, then by closeness (in units) to the nearest unit that matched the query (the context
   around a match), then by position; each is kept if it still fits. What is kept is put back in the original order.
4. The budget is checked on the tokens of the kept text as a whole (a unit's tokens alone can differ by one at a
   boundary); while over, the last-taken unit goes.

A text already within the budget comes back unchanged.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..contract.errors import HeteroError

# A unit ends after a sentence end (with closing quotes / brackets) and the whitespace after it, or after a newline.
_UNIT_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n\s*")
_WORD = re.compile(r"\w+")
K1, B = 1.2, 0.75


def split_units(text: str) -> list[str]:
    """Sentences and lines of ``text``, each with its trailing whitespace; ``"".join(units) == text``."""
    units, start = [], 0
    for match in _UNIT_END.finditer(text):
        if match.end() > start and text[start:match.start()].strip():
            units.append(text[start:match.end()])
            start = match.end()
    if start < len(text):
        if units and not text[start:].strip():
            units[-1] += text[start:]
        else:
            units.append(text[start:])
    return units


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def bm25(units: Sequence[str], query: str) -> list[float]:
    """Each unit's BM25 score against the words of ``query`` (the units are the collection)."""
    terms = set(words(query))
    bags = [Counter(words(u)) for u in units]
    if not terms or not bags:
        return [0.0] * len(units)
    average = sum(sum(b.values()) for b in bags) / len(bags) or 1.0
    n = len(bags)
    idf = {t: math.log(1 + (n - df + 0.5) / (df + 0.5)) for t in terms
           if (df := sum(1 for b in bags if t in b))}
    scores = []
    for bag in bags:
        size = sum(bag.values())
        score = 0.0
        for term, weight in idf.items():
            tf = bag.get(term, 0)
            if tf:
                score += weight * tf * (K1 + 1) / (tf + K1 * (1 - B + B * size / average))
        scores.append(score)
    return scores


def instruction_scores(units: Sequence[str], instruction: set[int]) -> list[float]:
    """Each unit's best BM25 match with one of the ``instruction`` units, that unit's match with itself counting 1:
    a long sentence among them would otherwise outweigh a short question."""
    best = [0.0] * len(units)
    for i in instruction:
        scores = bm25(units, units[i])
        if scores[i] > 0:
            best = [max(b, s / scores[i]) for b, s in zip(best, scores, strict=True)]
    return best


def check_budget(budget: Any, name: str = "compress_to") -> int:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise HeteroError(f"{name}={budget!r}; expected a positive number of tokens")
    return budget


def compress_text(text: str, budget: int, count: Callable[[str], int], query: str | None = None,
                  max_unit_chars: int | None = None) -> str:
    """``text`` cut to at most ``budget`` tokens (``count`` says how many a text has) by keeping its most relevant
    units (see the module's notes). ``max_unit_chars``: a unit longer than this cannot fit and is never tokenized
    (a guard against giving a tokenizer megabytes at once)."""
    check_budget(budget)
    if not isinstance(text, str):
        raise HeteroError(f"compression takes text, got {type(text).__name__}")
    units = split_units(text)
    if not units or ((max_unit_chars is None or len(text) <= max_unit_chars) and count(text) <= budget):
        return text
    forced: set[int] = set()
    if query is None:
        forced = {0, min(1, len(units) - 1), max(len(units) - 2, 0), len(units) - 1}
    limit = max_unit_chars if max_unit_chars is not None else math.inf
    sizes = [count(u) if len(u) <= limit else budget + 1 for u in units]
    scores = bm25(units, query) if query is not None else instruction_scores(units, forced)
    matched = [i for i, s in enumerate(scores) if s > 0]

    def distance(i: int) -> int:
        return min((abs(i - j) for j in matched), default=0)

    order = sorted(range(len(units)), key=lambda i: (i not in forced, -scores[i], distance(i), i))
    taken: list[int] = []
    used = 0
    for i in order:
        if used + sizes[i] <= budget:
            taken.append(i)
            used += sizes[i]
        elif i in forced:
            raise HeteroError(f"compress_to={budget} tokens cannot hold the text's first two and last two "
                              f"sentences ({sum(sizes[j] for j in forced)} tokens), kept as the instruction",
                              hint="give a larger budget")
    while taken:
        kept = "".join(units[i] for i in sorted(taken))
        if count(kept) <= budget:
            return kept
        taken.pop()
    return ""


def token_counter(llm: Any) -> tuple[Callable[[str], int], int]:
    """How many tokens a text has on ``llm`` (its special tokens aside), and the longest text worth counting for a
    budget of one token (longer units are skipped untokenized)."""
    tok = llm._tok()
    return (lambda text: len(tok.encode(text, add_special_tokens=False))), tok.max_token_chars


def compress_for(llm: Any, prompt: Any, budget: Any, query: str | None = None) -> str:
    """``prompt`` (text) fitted into ``budget`` tokens of ``llm`` (``Llm.generate(compress_to=...)``); without a
    ``query``, the prompt's first two sentences and last two are the query and are kept."""
    check_budget(budget)
    if not isinstance(prompt, str):
        raise HeteroError("compress_to takes a text prompt, not token ids")
    count, chars = token_counter(llm)
    return compress_text(prompt, budget, count, query, max_unit_chars=budget * chars)


def compress_messages(messages: Sequence[Mapping[str, Any]], budget: int,
                      prompt_tokens: Callable[[list[dict[str, Any]]], int], count: Callable[[str], int],
                      max_unit_chars: int | None = None) -> list[dict[str, Any]]:
    """The conversation with its last user message compressed so that the whole prompt (``prompt_tokens`` of the
    messages, template included) fits ``budget`` tokens. Other messages are kept as they are."""
    check_budget(budget)
    out = [dict(m) for m in messages]
    last = next((i for i in range(len(out) - 1, -1, -1)
                 if out[i].get("role") == "user" and isinstance(out[i].get("content"), str)), None)
    if last is None:
        raise HeteroError("compress_to: the conversation has no user message with text content to compress")
    text = out[last]["content"]
    out[last]["content"] = ""
    room = budget - prompt_tokens(out)
    if room < 1:
        raise HeteroError(f"compress_to={budget} tokens: the conversation without its last user message already "
                          f"takes {budget - room}", hint="give a larger budget")
    while room >= 1:  # the template may join the content's first or last token with its own: check the whole
        out[last]["content"] = compress_text(text, room, count, max_unit_chars=max_unit_chars)
        over = prompt_tokens(out) - budget
        if over <= 0:
            return out
        room -= over
    raise HeteroError(f"compress_to={budget} tokens: no part of the last user message fits beside the rest")


__all__ = ["bm25", "compress_for", "compress_messages", "compress_text", "instruction_scores", "split_units",
           "token_counter"]
