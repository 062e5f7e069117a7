"""Needle in a haystack, NeedleBench style: synthetic facts (needles) hidden at chosen depths of a plain-prose text
(the haystack) cut to chosen context lengths, a question the model answers from the text, and the fraction of the
needles it retrieves, per context length x depth.

- **Haystack**: the prose paragraphs of the Python language reference that CPython ships (``pydoc_data.topics``,
  on every machine with Python; code examples, lists and headings are dropped), or a text file of the user's.
- **Needles**: "The secret number of the <adjective> <noun> is <6 digits>." drawn from a seeded generator: a
  (length, depth, repeat) cell gets the same needles in every run. One needle is NeedleBench's single-needle
  retrieval; N needles its multi-needle retrieval: the first at the depth, the others spread evenly after it.
- **Length**: the tokens of the whole prompt the model reads (chat template, instructions and question included).
  Haystack sentences are added while the prompt fits; the needle goes in at the sentence boundary nearest its depth
  (the share of the haystack's tokens before it).
- **Score**: the share of the needles whose number appears in the reply (greedy decoding).
- **Compression** (``hetero.llm.compress``): the document is cut to a share of its tokens by BM25 relevance to the
  question before the prompt is built; the table still says the uncompressed length.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contract.errors import HeteroError
from .compress import compress_text, split_units

_ADJECTIVES = ("amber", "brass", "copper", "crimson", "dusty", "emerald", "frozen", "golden", "hidden", "ivory",
               "jade", "lunar", "marble", "northern", "quiet", "rusty", "silver", "velvet", "wooden", "hollow")
_NOUNS = ("anchor", "badger", "castle", "dragon", "falcon", "garden", "harbor", "island", "lantern", "meadow",
          "orchard", "pelican", "quarry", "river", "saddle", "tower", "valley", "walrus", "lighthouse", "violin")
DEFAULT_DEPTHS = (0.0, 25.0, 50.0, 75.0, 100.0)
DEFAULT_LENGTHS = (512, 1024, 2048)


@dataclass(frozen=True)
class Needle:
    subject: str
    answer: str

    @property
    def fact(self) -> str:
        return f"The secret number of the {self.subject} is {self.answer}."

    def found_in(self, reply: str) -> bool:
        return re.search(rf"(?<!\d){self.answer}(?!\d)", reply) is not None


def make_needles(count: int, rng: random.Random) -> list[Needle]:
    subjects = rng.sample([f"{a} {n}" for a in _ADJECTIVES for n in _NOUNS], count)
    return [Needle(s, str(rng.randint(100000, 999999))) for s in subjects]


def question(needles: Sequence[Needle]) -> str:
    if len(needles) == 1:
        return f"What is the secret number of the {needles[0].subject}? Answer with the number only."
    names = ", ".join(f"the {n.subject}" for n in needles[:-1]) + f" and the {needles[-1].subject}"
    return f"What are the secret numbers of {names}? Answer with each name and its number."


def score(reply: str, needles: Sequence[Needle]) -> float:
    return sum(n.found_in(reply) for n in needles) / len(needles)


# -- the haystack ------------------------------------------------------------------------------------------------
def _prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of running text: not indented (code), not a list item, not a heading or its underline."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.splitlines()
        if not lines or lines[0].startswith((" ", "*", "-", ">>>", "+")) or (len(lines) < 2 and len(block) < 80):
            continue
        if any(set(line.strip()) <= set("*=-~^") for line in lines):
            continue
        paragraph = " ".join(line.strip() for line in lines)
        if sum(ch.isalpha() for ch in paragraph) > 0.7 * len(paragraph):
            out.append(paragraph)
    return out


def haystack_sentences(path: str | Path | None = None) -> tuple[list[str], str]:
    """The haystack's sentences, each with a leading space, and where they came from."""
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise HeteroError(f"--haystack {path}: cannot read it as UTF-8 text ({exc})") from exc
        source = str(path)
        paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    else:
        try:
            from pydoc_data.topics import topics
        except ImportError as exc:
            raise HeteroError("this Python has no pydoc_data (the language reference the default haystack comes "
                              "from)", hint="give a plain-text file with --haystack FILE") from exc
        source = "the Python language reference (pydoc_data.topics)"
        paragraphs = [p for key in sorted(topics) for p in _prose_paragraphs(topics[key])]
    sentences = [" " + unit.strip() for p in paragraphs for unit in split_units(p) if unit.strip()]
    if not sentences:
        raise HeteroError(f"the haystack {source} has no sentences")
    return sentences, source


# -- prompts -----------------------------------------------------------------------------------------------------
class Prompter:
    """The model's prompt for a document and a question, and its token counts."""

    def __init__(self, llm: Any, template: str = "auto") -> None:
        if template not in ("auto", "chat", "plain"):
            raise HeteroError(f"template={template!r}; expected auto, chat or plain")
        if template == "chat" and llm.template is None:
            raise HeteroError(f"model {llm.name!r} has no chat template", hint="use --template plain")
        self.llm = llm
        self.chat = template == "chat" or (template == "auto" and llm.template is not None)
        self._counts: dict[str, int] = {}

    def count(self, text: str) -> int:
        if text not in self._counts:
            self._counts[text] = len(self.llm.tokenizer.encode(text, add_special_tokens=False))
        return self._counts[text]

    def text(self, document: str, ask: str) -> str:
        body = ("Read the document and answer the question after it.\n\n<document>\n"
                f"{document}\n</document>\n\nQuestion: {ask}")
        if self.chat:
            return self.llm.template.render([{"role": "user", "content": body}], add_generation_prompt=True)
        return body + "\nAnswer:"

    def ids(self, document: str, ask: str) -> list[int]:
        return list(self.llm.tokenizer.encode(self.text(document, ask), add_special_tokens=not self.chat))


@dataclass
class Case:
    """One prompt of the grid."""

    length: int  # the prompt tokens asked for
    depth: float  # percent
    needles: list[Needle]
    document: str
    ids: list[int]
    compressed_from: int = 0  # the document's tokens before compression (0: not compressed)

    @property
    def question(self) -> str:
        return question(self.needles)


def needle_depths(depth: float, count: int) -> list[float]:
    """Where each of ``count`` needles goes: the first at ``depth``, the others evenly spread after it."""
    return [depth + i * (100.0 - depth) / count for i in range(count)]


def build_case(prompter: Prompter, sentences: Sequence[str], length: int, depth: float, needles: list[Needle],
               compress: float | None = None) -> Case:
    """The prompt of ``length`` tokens with ``needles`` at ``depth`` percent of the haystack (compressed to the
    ``compress`` share of the document's tokens when given)."""
    ask = question(needles)
    facts = [" " + n.fact for n in needles]
    room = length - len(prompter.ids("".join(facts).lstrip(), ask))
    if room < 0:
        raise HeteroError(f"a context of {length} tokens cannot hold the instructions, question and needles "
                          f"({length - room} tokens)")
    hay: list[str] = []
    used = 0
    while True:
        sentence = sentences[len(hay) % len(sentences)]
        if used + prompter.count(sentence) > room:
            break
        hay.append(sentence)
        used += prompter.count(sentence)
    while True:
        document = _insert(prompter, hay, facts, needle_depths(depth, len(needles)))
        ids = prompter.ids(document, ask)
        if len(ids) <= length or not hay:
            break
        hay.pop()  # sentences joined can tokenize longer than apart: drop one and check again
    case = Case(length, depth, needles, document, ids)
    if compress is not None:
        tokens = prompter.count(document)
        kept = compress_text(document, max(1, round(compress * tokens)), prompter.count, query=ask)
        case.document, case.ids, case.compressed_from = kept.strip(), prompter.ids(kept.strip(), ask), tokens
    return case


def _insert(prompter: Prompter, hay: list[str], facts: list[str], depths: list[float]) -> str:
    total = sum(prompter.count(s) for s in hay)
    before = [0]
    for s in hay:
        before.append(before[-1] + prompter.count(s))
    slots = [min(range(len(before)), key=lambda i: abs(before[i] - d / 100 * total)) for d in depths]
    parts: list[str] = []
    for i in range(len(hay) + 1):
        parts += [f for f, slot in zip(facts, slots, strict=True) if slot == i]
        if i < len(hay):
            parts.append(hay[i])
    return "".join(parts).lstrip()


# -- running -----------------------------------------------------------------------------------------------------
@dataclass
class Trial:
    length: int
    depth: float
    prompt_tokens: int
    score: float
    reply: str


@dataclass
class Grid:
    """The trials of one setting (KV cache type, compression) over lengths x depths."""

    label: str
    lengths: list[int]
    depths: list[float]
    trials: list[Trial] = field(default_factory=list)

    def cell(self, length: int, depth: float) -> float | None:
        scores = [t.score for t in self.trials if t.length == length and t.depth == depth]
        return sum(scores) / len(scores) if scores else None

    def rows(self) -> list[list[float | None]]:
        return [[self.cell(n, d) for d in self.depths] for n in self.lengths]

    def mean(self) -> float | None:
        return sum(t.score for t in self.trials) / len(self.trials) if self.trials else None


def case_seed(seed: int, length: int, depth: float, repeat: int) -> random.Random:
    return random.Random(f"needle-{seed}-{length}-{depth:g}-{repeat}")  # str seeds are stable across runs


def run_grid(llm: Any, grid: Grid, sentences: Sequence[str], *, needles: int = 1, repeats: int = 1,
             template: str = "auto", compress: float | None = None, seed: int = 0, max_new_tokens: int = 32,
             log: Callable[[str], None] | None = None) -> Grid:
    """Fill ``grid`` with the model's trials (greedy decoding)."""
    prompter = Prompter(llm, template)
    for length in grid.lengths:
        for depth in grid.depths:
            for r in range(repeats):
                hidden = make_needles(needles, case_seed(seed, length, depth, r))
                case = build_case(prompter, sentences, length, depth, hidden, compress)
                reply = llm.generate(case.ids, max_new_tokens, temperature=0.0)
                trial = Trial(length, depth, len(case.ids), score(reply, hidden), reply)
                grid.trials.append(trial)
                if log:
                    log(f"{grid.label}: {length} tokens ({trial.prompt_tokens} read), depth {depth:g}%: "
                        f"{100 * trial.score:.0f}% {reply.strip()[:60]!r}")
    return grid


def table(grid: Grid) -> str:
    """The grid as a markdown table: rows are context lengths, columns needle depths, cells accuracy in percent."""

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.0f}"

    head = "| tokens | " + " | ".join(f"{d:g}%" for d in grid.depths) + " | mean |"
    lines = [head, "|" + "---|" * (len(grid.depths) + 2)]
    for length, row in zip(grid.lengths, grid.rows(), strict=True):
        known = [v for v in row if v is not None]
        mean = sum(known) / len(known) if known else None
        lines.append(f"| {length} | " + " | ".join(pct(v) for v in row) + f" | {pct(mean)} |")
    lines.append(f"| mean | {' | '.join(pct(_column_mean(grid, d)) for d in grid.depths)} | {pct(grid.mean())} |")
    return "\n".join(lines)


def _column_mean(grid: Grid, depth: float) -> float | None:
    scores = [t.score for t in grid.trials if t.depth == depth]
    return sum(scores) / len(scores) if scores else None


__all__ = ["Case", "Grid", "Needle", "Prompter", "build_case", "haystack_sentences", "make_needles", "run_grid",
           "score", "table"]
