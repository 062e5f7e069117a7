"""How often token compression (hetero.llm.compress) keeps the needle sentence of a needle-eval document, per budget
share and query: the eval's question, a vague one, one sharing no rare word, and none (the prompt's own first two
and last two sentences). No model: the budget counts words, the haystack is the eval's (docs/long-context.md).

    python benchmarks/compress_needle.py [--trials 100]
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable

from hetero.llm.compress import compress_text
from hetero.llm.needle import Needle, haystack_sentences, make_needles, question

QUERIES: dict[str, Callable[[list[Needle]], str] | None] = {
    "the eval's question": question,
    "'What number is hidden in the document?'": lambda _: "What number is hidden in the document?",
    "'Which code was mentioned?' (no rare word shared)": lambda _: "Which code was mentioned?",
    "none: the prompt's first two + last two sentences": None,
}


def words(text: str) -> int:
    return len(text.split())


def kept(sentences: list[str], trial: int, share: float, query: Callable[[list[Needle]], str] | None) -> bool:
    rng = random.Random(trial)
    start = rng.randrange(len(sentences) - 150)
    hay = sentences[start:start + 150]
    needle = make_needles(1, rng)[0]
    at = rng.randrange(len(hay) + 1)
    text = "".join([*hay[:at], " " + needle.fact, *hay[at:]]).strip()
    ask = query([needle]) if query is not None else None
    if query is None:  # the question ends the prompt
        text += " " + question([needle])
    return needle.fact in compress_text(text, int(share * words(text)), words, query=ask)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    args = parser.parse_args()
    sentences, _ = haystack_sentences()
    print(f"| share kept | query | needle kept in {args.trials} documents |\n|---|---|---|")
    for share in (0.5, 0.25, 0.1):
        for label, query in QUERIES.items():
            hits = sum(kept(sentences, t, share, query) for t in range(args.trials))
            print(f"| {share:g} | {label} | {hits} |")


if __name__ == "__main__":
    main()
